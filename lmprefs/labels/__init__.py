"""Human (and simulated) preference labels: label types and their losses (`types`), the SQLite label store (`store`),
label-file import/export (`formats`) and scripted labelers for the mock sentiment/descriptiveness tasks
(`labelers`). Nothing is imported here, so `import lmprefs.labels.store` never pulls in torch.
"""

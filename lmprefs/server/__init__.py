"""The labeling web app: people sign in with a token, pick the best of N continuations of a query (or skip or flag
it), and an admin watches counts, throughput and labeler quality (gold accuracy, agreement, position bias, time on
task) and downloads the labels. FastAPI + Jinja2 templates over the SQLite label store (`lmprefs.labels.store`);
`app.create_app` builds it from the routes in `labeling` and `admin`, `queue` decides what each labeler sees, `api`
is the JSON API and `client` its Python client, `lmprefs.cli.serve` runs it (`lmprefs serve`, `lmprefs labelers`).
Never imports torch.
"""

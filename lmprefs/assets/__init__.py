"""The offline assets, built once into the cache from locally installed packages: models and tokenizers
(`models`), corpora (`corpora`), the cache and download helpers (`cache`), and the list `lmprefs assets` shows
(`registry`). Nothing here reaches a hub."""

"""A user's package for the import-path tests: a model builder and a dataset loader."""

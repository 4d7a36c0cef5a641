
docs-search
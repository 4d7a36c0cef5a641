
©
docs-search
2026-11-01ç
	open_page)Fetch one documentation page by its path.path *
cache:read*	docs:read26{"type":"object","properties":{"q":{"type":"string"}}}˝
search_docs0Full-text search over the product documentation.limitquery *	docs:read2†{"additionalProperties":false,"properties":{"limit":{"maximum":50,"minimum":1,"type":"integer"},"query":{"type":"string"}},"required":["query"],"type":"object"}@d001b2724c1fa6d3c8bc66b0c472e9443444703aa329cf0e29d781e524428369
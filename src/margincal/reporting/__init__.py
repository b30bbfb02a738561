"""Reports: Markdown tables and PNG figures built from result JSON."""

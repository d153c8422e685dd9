"""Reports: readable tables for the terminal (and, later, HTML with plots)."""

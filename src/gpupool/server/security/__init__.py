"""Credentials at the API and the audit trail."""

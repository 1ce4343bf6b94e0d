"""Pricing a request and splitting its charge among hops (``pricing``), and the billing audit (``audits``)."""

"""Billing: pricing a request and splitting its charge among hops (``pricing``),
and the billing audit that flags and refunds (``audits``)."""

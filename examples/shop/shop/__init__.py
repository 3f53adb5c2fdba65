"""The shop: products in one warehouse, and the orders of Ductor's tenants, each under its tenant's id."""

"""Making a divergence small and findable: reduce shrinks a failing case, fuzz draws new ones."""

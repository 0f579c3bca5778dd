"""Claim registries per paper: ``paper_checks.claims.<paper>.<section>`` (one module per paper
section; each module registers its claims with :func:`paper_checks.registry.claim`)."""

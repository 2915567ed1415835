"""Workflows: TOML jobs and steps (``swamp.domain.workflow``) run through the dispatch service."""

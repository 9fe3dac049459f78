"""Adapters that bring an existing training script under dlhpc with a few lines.

Each framework adapter is its own module (``lightning``, ``transformers``, ``script`` for
plain argparse scripts, ``determined`` for Determined Core API scripts) and imports its
framework only when used: ``import dlhpc.integrations`` costs nothing. Adapters run inside
jobs, so they build on :mod:`dlhpc.harness` and :mod:`dlhpc.protocol` only, never on the
store, the orchestrator, the config loader or the reports (``.importlinter``).
"""

"""Test-only patches, registered through primus-testing's `primus.patches` entry points: each
module imports no upstream, and each patch is off unless a test sets its environment variable."""

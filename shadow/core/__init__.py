"""The domain: settings, grid arithmetic, session bookkeeping, protocols, errors. Pure Python."""

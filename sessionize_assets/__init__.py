"""sessionize_assets: sessions, daily aggregates and user attributes kept exact while events arrive late."""

__version__ = "0.1.0"

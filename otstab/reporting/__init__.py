"""What people read: the HTML/PDF report, the model card, the policy gate and the figures
(``otstab.plot``, matplotlib loaded on first use); the trend report of a history of observed
shifts (``_trend``: ``otstab monitor``'s page)."""

from ._report import (
    model_card,
    model_card_markdown,
    policy_gate,
    render_html,
    write_pdf,
    write_report,
)
from ._trend import gate_share, projection, trend_html, write_trend

__all__ = ["model_card", "model_card_markdown", "policy_gate", "render_html", "write_pdf",
           "write_report", "trend_html", "write_trend", "projection", "gate_share"]

"""What people read: the HTML/PDF report, the model card, the policy gate and the figures
(``otstab.plot``, matplotlib loaded on first use)."""

from ._report import (
    model_card,
    model_card_markdown,
    policy_gate,
    render_html,
    write_pdf,
    write_report,
)

__all__ = ["model_card", "model_card_markdown", "policy_gate", "render_html", "write_pdf",
           "write_report"]

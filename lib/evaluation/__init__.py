"""Evaluation shared by the four papers: metrics and statistics (one implementation each), text
metrics, the cross-paper evaluation of notebook 06, recomputation of committed metrics, and figures."""

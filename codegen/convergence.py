"""Moved to ``codegen.verification.convergence`` (one home for verification); kept for old imports."""

from .verification.convergence import Study, convergence_study, plot_studies, plot_study  # noqa: F401

__all__ = ["Study", "convergence_study", "plot_study", "plot_studies"]

"""The Bayesian learning rule: global (Eq. 58) and local (Eq. 60) updates.

Reference: Khan & Rue, *The Bayesian Learning Rule*, JMLR 24 (2023)
[arXiv:2107.04562 v1]. Equation numbers in blrppl follow that version
(``docs/references.md``); elsewhere the code writes "(Khan & Rue, Eq. N)".
"""

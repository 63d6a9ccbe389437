"""Thin adapters that plug bonkernels estimators into RL trainers.

* ``bonkernels.integrations.trl``: ``BonkernelsGRPOTrainer``, a drop-in ``trl.GRPOTrainer``
  subclass whose advantages come from any bonkernels estimator.
* ``bonkernels.integrations.verl``: advantage estimators with verl's signature, registered in
  verl's estimator registry as ``bk_<estimator>``.

Neither module is imported here: each imports its trainer library only when used.
"""

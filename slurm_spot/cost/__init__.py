"""What a job costs and how often it should checkpoint.

- :mod:`~slurm_spot.cost.planner`: interruption rates, Young's and Daly's checkpoint intervals,
  the expected waste and run time of a job (pure functions);
- :mod:`~slurm_spot.cost.prices`: the site's price book (instance prices asked of each provider,
  :mod:`slurm_spot.providers.prices`), storage and egress prices;
- :mod:`~slurm_spot.cost.accounting`: what a recorded job used and cost (events or sacct);
- :mod:`~slurm_spot.cost.simulator`: a discrete-event simulation of one job under interruptions;
- :mod:`~slurm_spot.cost.plots`: matplotlib figures for ``cost --plot`` and ``simulate --plot``.
"""

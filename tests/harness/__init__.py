"""What the tests share, one module per job: waiting on a condition (waiting), starting real
gpufleet processes (processes, in_process), hand-driven collector streams (streams), Fleet API
metadata (fleet_api), reading what was stored (stored), the real servers the tests run
(influx, slurm, pg, k8s_standin, pki, alert_receiver), the repair tests' CLI and policies
(repair), and fleets built for the dashboard (fleets). Fixtures live in conftest.py files:
the root one for what every area uses, one per area for the rest."""

"""Commands built on the library: results tables, benchmarks, exports and studies, each run as
`python -m marl_jax.tools.NAME`.  The library never imports this package, so a tool may import any
library module (the loop, the configs, the workflows) without making a loop, and a library module
never loads a tool's flags, plots or studies.  A results table of finished runs belongs in `report`
(or beside the study that writes the runs); what the tools share is `intervals` (95% intervals over
seeds), `runs` (finished run directories read back), `bounds` (the machine's matmul and copy rates)
and `hlo_profile` (where a compiled call's time goes)."""

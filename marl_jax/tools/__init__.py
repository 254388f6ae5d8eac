"""Commands built on the library: results tables, benchmarks, exports and studies, each run as
`python -m marl_jax.tools.NAME`.  The library never imports this package, so a tool may import any
library module (the loop, the configs, the workflows) without making a loop, and a library module
never loads a tool's flags, plots or studies."""

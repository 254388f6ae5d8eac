"""marl_jax: multi-agent RL of transformer agents that learn to collaborate."""

from setuptools import find_packages, setup

setup(
    name="marl_jax",
    version="0.1.0",
    description="Multi-agent RL of transformer agents that learn to collaborate, in JAX.",
    packages=find_packages(include=["marl_jax", "marl_jax.*"]),
    python_requires=">=3.11",
    license="Apache-2.0",
    install_requires=[
        "jax>=0.10",
        "flax>=0.10",
        "optax",
        "orbax-checkpoint",
        "chex",
        "ml-collections",
        "absl-py",
        "numpy",
        "scipy",
        "etils",
        "tqdm",
        "tensorboardX",
        "tensorflow-datasets",
        "array-record",
        "grain",
        "safetensors",
        "tokenizers",
        "matplotlib",  # the credit benchmark's plots
    ],
    extras_require={
        "dev": ["pytest", "pytest-xdist", "nbmake", "ipykernel"],
        # The documentation site: python -m sphinx -W --keep-going -b html docs docs/_build/html
        "docs": ["sphinx", "myst-nb", "sphinx-book-theme"],
        # The language-model benchmark's peer (python -m marl_jax.tools.lm_bench --peer=transformers). Install
        # torch first, so that transformers finds it and pulls in no GPU build: pip install torch==2.13.0
        # --index-url https://download.pytorch.org/whl/cpu, then pip install -e ".[peer]".
        "peer": ["torch==2.13.0", "transformers"],
    },
)

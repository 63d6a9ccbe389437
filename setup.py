"""Build script. Pure Python for now; the native-kernels work adds the C++/CUDA extension here."""
from setuptools import find_packages, setup

setup(
    name="bonkernels",
    version="0.1.0",
    description="Fused batched pass@k / max@k advantage estimators for RL on LLMs",
    packages=find_packages(include=["bonkernels", "bonkernels.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "numpy"],
)

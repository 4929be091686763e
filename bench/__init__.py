"""Load tools that drive a real t3d daemon through its public API only."""

"""Git for threads (docs/architecture.md, Git): worktrees, per-turn checkpoints, diff and revert.

repo.py reads ordinary repositories in-process; refs.py runs git through the spawner
(and reads unusual repositories through it); checkpoints.py plans the commands (pure);
service.py drives captures, baselines, diffs and reverts; worktrees.py makes and removes
threads' worktrees. The JSON-RPC side lives with the API (t3d/api/git_methods.py).
"""

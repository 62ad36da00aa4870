"""How far noisy plurality votes can go when each teacher holds a few classes.

PATE-FL's label for a public query is the argmax of the agents' one-hot votes plus noise of σ
votes (the plan's calibration for Q queries at the job's ε). With label-skewed shards a teacher
can only vote for its own classes, so the true class gets at most its holders' votes. This
script measures, on a data set's validation split (its ``holdout`` view: the test split is never
read), the pseudo-label accuracy of:

- ``nearest``: each teacher a 1-nearest-neighbour classifier on its own records, in the first
  ``--dim`` principal components of public records (a strong teacher for its own classes);
- ``abstain-q``: the same, but a teacher votes only when the query's distance to its nearest
  record is within the q-quantile of its own records' leave-one-out nearest distances, else it
  sends the zero vector (still L2 ≤ 1: the vote's sensitivity and charge are unchanged);
- ``public-t``: the same, but a teacher votes only when at least a fraction t of the query's
  ``NEIGHBOURS`` nearest records, among its own records and the public records that are not
  queries, are its own: a nearest-neighbour estimate of how much likelier the query is under its
  own data than under the public pool's mix of every class, which a distance alone cannot tell
  (the public records are public, so this too costs nothing);
- ``oracle``: each holder of the query's class votes for it, every other teacher abstains:
  no voting rule does better with these holders.

With ``--vote-share f`` < 1 every teacher keeps only the ⌈f·Q⌉ votes it ranks first by its own
share (the product's cap, docs/accounting.md#capped-votes), and σ is the plan's for that cap.

Each row gives the noiseless plurality's accuracy and the mean over ``--noise-draws`` draws of
the noisy one. One JSON line per rule. Run: ``python benchmarks/vote_ceiling.py`` (Fashion-MNIST,
100 agents, shards of 3, ε 4: about a minute), or ``--quick`` (digits, seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpfl.learning.algorithms.registry import get_algorithm
from dpfl.learning.algorithms.voting import capped, vote_cap
from dpfl.learning.data import ShardsPartition, federate, load_dataset
from dpfl.learning.jobs import parse_job

QUANTILES = (0.8, 0.9, 0.95)
SHARES = (0.05, 0.1, 0.2)
NEIGHBOURS = 20

Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Setting:
    dataset: str
    agents: int
    classes_per_agent: int
    queries: int
    epsilon: float
    delta: float
    dim: int
    noise_draws: int
    vote_share: float = 1.0


def vote_sigma(s: Setting) -> float:
    """σ in votes: what PATE-FL's plan calibrates for ``s.queries`` queries, agent level."""
    job = parse_job(
        {
            "name": "vote-ceiling",
            "algorithm": "pate-fl",
            "data": {
                "dataset": s.dataset,
                "partition": {"scheme": "shards", "classes_per_agent": s.classes_per_agent},
                "public": {"source": "test", "fraction": 0.3},
            },
            "privacy": {
                "unit": "agent",
                "delta": s.delta,
                "target_epsilon": s.epsilon,
                "noise": "skellam",
            },
            "params": {"queries": s.queries, "vote_share": s.vote_share},
        }
    )
    return float(get_algorithm("pate-fl").plan(job, population=s.agents).noise_multiplier)


def _squared_distances(a: Floats, b: Floats) -> Floats:
    d: Floats = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.maximum(d, 0.0)


def _own_share(to_own: Floats, to_public: Floats) -> Floats:
    """Per query, the fraction of its ``NEIGHBOURS`` nearest records (own and public) that are
    the teacher's own."""
    k = min(NEIGHBOURS, to_own.shape[1] + to_public.shape[1])
    both = np.concatenate([to_own, to_public], axis=1)
    nearest = np.argpartition(both, k - 1, axis=1)[:, :k]
    share: Floats = (nearest < to_own.shape[1]).mean(axis=1)
    return share


def votes(s: Setting, seed: int = 0) -> tuple[dict[str, Floats], npt.NDArray[np.int64]]:
    """Each rule's vote histogram over the queries, and the queries' true labels."""
    view = load_dataset(f"{s.dataset}?holdout=0.1&holdout_seed=0")
    rng = np.random.default_rng(seed)
    public_x = view.x_test.reshape(len(view.x_test), -1).astype(np.float64)
    if len(public_x) < s.queries + 2 * s.dim:
        sys.exit(f"the validation split has {len(public_x)} records, too few for the queries")
    order = rng.permutation(len(public_x))
    asked, basis_rows = order[: s.queries], order[s.queries :]
    mean = public_x[basis_rows].mean(0)
    _, _, vt = np.linalg.svd(public_x[basis_rows] - mean, full_matrices=False)
    basis = vt[: s.dim].T

    def project(x: Floats) -> Floats:
        projected: Floats = (x - mean) @ basis
        return projected

    queries, truth = project(public_x[asked]), view.y_test[asked].astype(np.int64)
    to_public = _squared_distances(queries, project(public_x[basis_rows]))
    federation = federate(
        view, scheme=ShardsPartition(s.classes_per_agent), num_agents=s.agents, seed=seed
    )
    train_x = view.x_train.reshape(len(view.x_train), -1).astype(np.float64)
    classes = int(view.num_classes)
    rows = np.arange(s.queries)
    hist = {r: np.zeros((s.queries, classes)) for r in ("nearest", "oracle")}
    hist |= {f"abstain-{q:g}": np.zeros((s.queries, classes)) for q in QUANTILES}
    hist |= {f"public-{t:g}": np.zeros((s.queries, classes)) for t in SHARES}
    keep = vote_cap(s.queries, s.vote_share)
    for indices in federation.agent_indices:
        own_x, own_y = project(train_x[indices]), view.y_train[indices]
        to_query = _squared_distances(queries, own_x)
        nearest = to_query.argmin(1)
        label, reach = own_y[nearest], np.sqrt(to_query[rows, nearest])
        among = _squared_distances(own_x, own_x)
        np.fill_diagonal(among, np.inf)
        own_reach = np.sqrt(among.min(1))
        own_share = _own_share(to_query, to_public)
        cast = {
            "nearest": np.ones(s.queries, dtype=bool),
            "oracle": np.isin(truth, np.unique(own_y)),
        }
        cast |= {f"abstain-{q:g}": reach <= np.quantile(own_reach, q) for q in QUANTILES}
        cast |= {f"public-{t:g}": own_share >= t for t in SHARES}
        for rule, voting in cast.items():
            ballot = np.zeros((s.queries, classes))
            ballot[rows[voting], (truth if rule == "oracle" else label)[voting]] = 1.0
            hist[rule] += capped(ballot, (own_share,), keep)
    return hist, truth


def accuracy(hist: Floats, truth: npt.NDArray[np.int64], sigma: float, draws: int) -> float:
    """The noisy argmax's accuracy, averaged over ``draws`` noise draws (seeded)."""
    rng = np.random.default_rng(1)
    hits = [(hist + rng.normal(0.0, sigma, hist.shape)).argmax(1) == truth for _ in range(draws)]
    return float(np.mean(hits))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--agents", type=int, default=100)
    parser.add_argument("--classes-per-agent", type=int, default=3)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--dim", type=int, default=50)
    parser.add_argument("--noise-draws", type=int, default=20)
    parser.add_argument("--vote-share", type=float, default=1.0, help="each teacher's cap")
    parser.add_argument("--quick", action="store_true", help="digits, 20 agents, 40 queries")
    args = parser.parse_args(argv)
    s = Setting(
        dataset="digits" if args.quick else args.dataset,
        agents=20 if args.quick else args.agents,
        classes_per_agent=args.classes_per_agent,
        queries=40 if args.quick else args.queries,
        epsilon=args.epsilon,
        delta=args.delta,
        dim=10 if args.quick else args.dim,
        noise_draws=args.noise_draws,
        vote_share=args.vote_share,
    )
    sigma = vote_sigma(s)
    hist, truth = votes(s)
    for rule, h in hist.items():
        line = {
            "dataset": s.dataset,
            "agents": s.agents,
            "classes_per_agent": s.classes_per_agent,
            "queries": s.queries,
            "vote_share": s.vote_share,
            "epsilon": s.epsilon,
            "sigma_votes": round(sigma, 4),
            "rule": rule,
            "mean_votes_cast": round(float(h.sum(1).mean()), 2),
            "noiseless_accuracy": round(accuracy(h, truth, 0.0, 1), 4),
            "noisy_accuracy": round(accuracy(h, truth, sigma, s.noise_draws), 4),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()

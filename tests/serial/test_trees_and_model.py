"""Double binary tree shapes, the cost model and its fitting."""

from __future__ import annotations

import pytest

from ringcomp import alphabeta
from ringcomp.collectives.auto import choose
from ringcomp.collectives.dbtree import binary_tree, double_tree


def check_tree(parent, children, p):
    roots = [r for r in range(p) if parent[r] < 0]
    assert len(roots) == 1
    for r in range(p):
        assert len(children[r]) <= 2
        for c in children[r]:
            assert parent[c] == r
        seen, node = set(), r
        while parent[node] >= 0:  # every rank reaches the root without a cycle
            assert node not in seen
            seen.add(node)
            node = parent[node]
        assert node == roots[0]


@pytest.mark.parametrize("p", list(range(1, 70)))
def test_double_tree_is_two_binary_trees(p):
    parent, children = binary_tree(p)
    check_tree(parent, children, p)
    (p0, c0), (p1, c1) = double_tree(p)
    check_tree(p0, c0, p)
    check_tree(p1, c1, p)
    if p % 2 == 0 and p > 2:
        # the point of two trees: no rank is a leaf in both (every link carries data)
        assert not [r for r in range(p) if not c0[r] and not c1[r]]


def test_closed_forms():
    c = alphabeta.Costs(alpha=1e-5, beta=1e-9, gamma=1e-10)
    assert all(alphabeta.predict(a, 1, 1 << 20, c) == 0 for a in ("ring", "tree", "rd",
                                                                  "rabenseifner", "dbtree"))
    n, p = 1 << 20, 4
    assert alphabeta.predict("ring", p, n, c) == pytest.approx(
        2 * (p - 1) * c.alpha + 2 * (p - 1) / p * n * c.beta + (p - 1) / p * n * c.gamma)
    assert alphabeta.predict("tree", p, n, c) == pytest.approx(
        4 * (c.alpha + n * c.beta) + 2 * n * c.gamma)
    # folding costs exactly two extra hops and one add for a non-power of two
    assert alphabeta.predict("rd", 5, n, c) - alphabeta.predict("rd", 4, n, c) == \
        pytest.approx(2 * (c.alpha + n * c.beta) + n * c.gamma)


def test_choice_follows_the_regime():
    c = dict.fromkeys(alphabeta.MODELS, alphabeta.Costs(alpha=50e-6, beta=1e-9, gamma=2e-10))
    assert choose(8, 8, c) in ("rd", "tree")  # latency-bound
    assert choose(8, 256 << 20, c) in ("ring", "rabenseifner")  # bandwidth-bound


def test_fit_recovers_constants():
    truth = alphabeta.Costs(alpha=30e-6, beta=2e-9, gamma=5e-10)
    samples = [(a, n, alphabeta.predict(a, 4, n, truth))
               for a in ("ring", "tree", "rd", "rabenseifner") for n in (8, 1 << 14, 1 << 20)]
    got = alphabeta.fit(samples, 4)
    assert got.alpha == pytest.approx(truth.alpha, rel=1e-6)
    assert got.beta == pytest.approx(truth.beta, rel=1e-6)
    assert got.gamma == pytest.approx(truth.gamma, rel=1e-6)


def test_fit_never_negative():
    samples = [("ring", 8, 1e-3), ("ring", 1 << 20, 1e-3), ("tree", 1 << 20, 5e-4)]
    got = alphabeta.fit(samples, 4)
    assert min(got.alpha, got.beta, got.gamma) >= 0


def test_auto_fit_survives_a_links_burst_allowance():
    """On a rate-limited link small messages pass within the burst at memory speed: the
    relative fit then makes the tree look 4x faster than the link allows at large sizes.
    The calibration falls back to the Hockney fit, exact at the largest size, and ``auto``
    picks a bandwidth-optimal algorithm for 64 MB instead of the tree."""
    from ringcomp.collectives.auto import CALIBRATION_SIZES, fit_for_choice

    p, link = 4, alphabeta.Costs(alpha=50e-6, beta=8e-9, gamma=0.0)  # 1 Gbit/s

    def measured(name, nbytes):
        fast = alphabeta.predict(name, p, nbytes, alphabeta.Costs(50e-6, 2e-11, 0.0))
        return fast if nbytes <= 64 << 10 else alphabeta.predict(name, p, nbytes, link)

    costs = {}
    for name in ("ring", "tree", "rabenseifner"):
        samples = [(name, n, measured(name, n)) for n in CALIBRATION_SIZES]
        costs[name] = fit_for_choice(samples, p)
        largest = CALIBRATION_SIZES[-1]
        assert alphabeta.predict(name, p, largest, costs[name]) == pytest.approx(
            measured(name, largest), rel=0.02)
    assert choose(p, 64 << 20, costs, ("ring", "tree", "rabenseifner")) != "tree"
    assert alphabeta.fit(  # the plain relative fit is what went wrong
        [("tree", n, measured("tree", n)) for n in CALIBRATION_SIZES], p).beta < 0.5 * 8e-9


def test_auto_fit_keeps_least_squares_where_the_model_holds():
    from ringcomp.collectives.auto import CALIBRATION_SIZES, fit_for_choice

    truth = alphabeta.Costs(alpha=30e-6, beta=2e-9, gamma=5e-10)
    samples = [("ring", n, alphabeta.predict("ring", 5, n, truth)) for n in CALIBRATION_SIZES]
    assert fit_for_choice(samples, 5) == alphabeta.fit(samples, 5)


def test_mpis_own_allreduce_is_modelled_by_its_measured_times():
    """MPI's Allreduce has no formula (the library switches algorithms by size): ``auto``
    interpolates its calibration times in log-log, holds the smallest below, never takes it
    above the largest (the library may switch algorithms there), and takes it where it is
    fastest."""
    mpi = alphabeta.Measured((8.0, 65536.0, 1 << 20, 16 << 20), (1e-4, 2e-4, 1e-3, 0.5))
    assert alphabeta.predict("mpi", 4, 65536, mpi) == pytest.approx(2e-4)
    assert alphabeta.predict("mpi", 4, 1, mpi) == pytest.approx(1e-4)
    assert alphabeta.predict("mpi", 4, 16 << 20, mpi) == pytest.approx(0.5)
    assert alphabeta.predict("mpi", 4, (16 << 20) + 1, mpi) == float("inf")
    middle = alphabeta.predict("mpi", 4, 256 << 10, mpi)  # halfway in log size
    assert middle == pytest.approx((2e-4 * 1e-3) ** 0.5)
    rd = alphabeta.Costs(alpha=60e-6, beta=1e-9, gamma=1e-10)
    costs = {"rd": rd, "mpi": mpi}
    assert choose(4, 8, costs, ("rd", "mpi")) == "mpi"  # 100 us against 2 x 60 us
    assert choose(4, 16 << 20, costs, ("rd", "mpi")) == "rd"  # 0.5 s against 0.07 s
    assert choose(4, 64 << 20, {"rd": alphabeta.Costs(1, 1, 1), "mpi": mpi},
                  ("rd", "mpi")) == "rd"  # unmeasured sizes: never MPI's
    assert choose(4, 8, {"rd": rd}) == "rd"  # by default, candidates without constants wait


def test_auto_cost_files_name_mpis_times_or_leave_it_out(tmp_path):
    from ringcomp.collectives.auto import load_costs

    shared = tmp_path / "shared.json"
    shared.write_text('{"alpha": 1e-5, "beta": 1e-9, "gamma": 0}')
    assert "mpi" not in load_costs(str(shared))  # no formula for MPI's own: not a candidate
    each = tmp_path / "each.json"
    each.write_text('{"rd": {"alpha": 1e-5, "beta": 1e-9, "gamma": 0}, '
                    '"mpi": {"sizes": [8, 1024], "seconds": [1e-5, 2e-5]}}')
    loaded = load_costs(str(each))
    assert loaded["mpi"] == alphabeta.Measured((8, 1024), (1e-5, 2e-5))
    assert loaded["mpi"].as_dict() == {"sizes": [8, 1024], "seconds": [1e-5, 2e-5]}


def test_calibrated_algorithms_are_ranked_by_their_measurements_within_the_calibration():
    """Within the calibrated sizes a candidate's own measured times decide, not its fit
    (which made rd look faster than MPI at 4 KB where it was slower); beyond the largest
    size the fit extrapolates; a near tie goes to MPI's own Allreduce; the constants
    survive the cost file's JSON."""
    from ringcomp.collectives.auto import PREFER_NATIVE, _constants

    sizes = (8.0, 4096.0, 65536.0)
    optimistic = alphabeta.Costs(alpha=1e-6, beta=1e-12, gamma=0.0)  # fit: rd looks fast
    rd = alphabeta.Calibrated(optimistic, sizes, (2e-5, 3e-5, 8e-5))
    mpi = alphabeta.Measured(sizes, (2e-5, 2.5e-5, 1e-4))
    assert alphabeta.predict("rd", 4, 4096, rd) == pytest.approx(3e-5)  # measured
    assert alphabeta.predict("rd", 4, 1 << 20, rd) == pytest.approx(
        alphabeta.predict("rd", 4, 1 << 20, optimistic))  # beyond: the fit
    costs = {"rd": rd, "mpi": mpi}
    assert choose(4, 4096, costs, ("rd", "mpi")) == "mpi"  # 25 us against 30 us
    assert choose(4, 65536, costs, ("rd", "mpi")) == "rd"  # 80 us against 100 us
    close = {"rd": alphabeta.Calibrated(optimistic, sizes, (2e-5, 2.5e-5 / PREFER_NATIVE * 1.01,
                                                            8e-5)), "mpi": mpi}
    assert choose(4, 4096, close, ("rd", "mpi")) == "mpi"  # within 10%: the library's
    assert _constants(rd.as_dict()) == rd and _constants(mpi.as_dict()) == mpi

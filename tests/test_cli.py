import re
import subprocess
import sys

import numpy as np
import pytest

import gpuembed as ge


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "gpuembed.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_info():
    out = run_cli("info")
    assert out.returncode == 0, out.stderr
    assert "gpuembed" in out.stdout and "backend  auto ->" in out.stdout
    assert re.search(r"\d+ threads, (omp|tbb|workqueue) layer; compiled code cached in",
                     out.stdout)


def test_demo_writes_png(tmp_path):
    out = run_cli("demo", "--dataset", "rotating_objects", "--backend", "cpu", "--auc",
                  "-o", str(tmp_path / "demo.png"))
    assert out.returncode == 0, out.stderr
    assert "10-NN accuracy" in out.stdout and "R_NX AUC" in out.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out.stdout
    else:
        assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_fit_time_leaves_out_first_use_compilation():
    """The demo's and embed's seconds: numba's compilation of a function on its
    first call is reported apart (an 8-s first demo would read as ten times its
    later runs); a compiled function's call adds nothing to it."""
    import time

    from numba import njit

    from gpuembed.cli import _seconds_text, _timed

    @njit
    def work(x):
        return x + 1

    def fit():
        time.sleep(0.2)
        return work(1)

    start = time.perf_counter()
    result, seconds, compiling = _timed(fit)
    wall = time.perf_counter() - start
    assert result == 2 and compiling > 0.01 and seconds >= 0.2
    assert abs(seconds + compiling - wall) < 0.05
    result, seconds, compiling = _timed(fit)
    assert result == 2 and compiling == 0.0 and seconds >= 0.2
    assert _seconds_text(0.93, 0.0) == "0.93 s"
    assert _seconds_text(0.93, 8.04) == ("0.93 s (+ 8.0 s compiling CPU code on first use, "
                                         "cached for later runs)")


def test_embed_file(tmp_path):
    X = np.random.default_rng(0).standard_normal((120, 5))
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", np.arange(120) % 3)
    for method in ("tsne", "ee", "le"):
        out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                      "--labels", str(tmp_path / "y.npy"), "--backend", "cpu", "--method", method,
                      "--perplexity", "10")
        assert out.returncode == 0, out.stderr
        assert np.load(tmp_path / "y_out.npy").shape == (120, 2)
        assert "10-NN accuracy" in out.stdout
    # Laplacian eigenmaps by LLL, the same as the estimator with the CLI's affinities.
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--method", "le", "--perplexity", "10",
                  "--n-landmarks", "40", "--random-state", "3")
    assert out.returncode == 0, out.stderr
    import gpuembed as ge

    np.testing.assert_array_equal(np.load(tmp_path / "y_out.npy"), ge.LaplacianEigenmaps(
        2, n_neighbors=30, perplexity=10.0, n_landmarks=40, random_state=3,
        backend="cpu").fit_transform(X))
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--method", "le", "--perplexity", "10",
                  "--n-landmarks", "40", "--random-state", "3", "--z-neighbors", "graph",
                  "--landmarks", "spread", "--refine", "2")
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y_out.npy"), ge.LaplacianEigenmaps(
        2, n_neighbors=30, perplexity=10.0, n_landmarks=40, random_state=3,
        z_neighbors="graph", landmarks="spread", refine=2, backend="cpu").fit_transform(X))
    for option, value in (("--z-neighbors", "graph"), ("--landmarks", "spread"),
                          ("--refine", "1")):
        out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                      "--backend", "cpu", "--method", "le", option, value)
        assert out.returncode == 1 and f"{option} applies to" in out.stderr
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--method", "tsne", "--n-landmarks", "40")
    assert out.returncode == 1 and "--n-landmarks applies to --method le" in out.stderr
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--method", "le", "--n-landmarks", "500")
    assert out.returncode == 1 and "n_landmarks" in out.stderr and "Traceback" not in out.stderr
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--method", "ee", "--nbody", "fgt", "--perplexity", "10")
    assert out.returncode == 0, out.stderr
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--method", "tsne", "--nbody", "fgt")
    assert out.returncode == 1 and "Gaussian" in out.stderr and "Traceback" not in out.stderr


def test_embed_with_approximate_neighbours(tmp_path):
    """--neighbors approx is the estimators' neighbors="approx" (which searches 120
    points exactly); multi-scale SNE, which has no such option, refuses it."""
    import gpuembed as ge

    X = np.random.default_rng(0).standard_normal((120, 12))
    np.save(tmp_path / "x.npy", X)
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--perplexity", "10", "--random-state", "2",
                  "--neighbors", "approx")
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y_out.npy"), ge.TSNE(
        2, 10.0, max_iter=1000, random_state=2, backend="cpu",
        neighbors="approx").fit_transform(X))
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y_out.npy"),
                  "--backend", "cpu", "--method", "msne", "--neighbors", "approx")
    assert out.returncode == 1 and "--neighbors approx does not apply" in out.stderr


def test_embed_sparse_file(tmp_path):
    """A scipy.sparse.save_npz file is embedded as it is, as the estimator would."""
    import scipy.sparse

    import gpuembed as ge

    X = scipy.sparse.random(150, 400, density=0.05, random_state=0, format="csr")
    scipy.sparse.save_npz(tmp_path / "x.npz", X)
    np.save(tmp_path / "labels.npy", np.arange(150) % 3)
    out = run_cli("embed", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npy"),
                  "--labels", str(tmp_path / "labels.npy"), "--backend", "cpu",
                  "--perplexity", "10", "--max-iter", "20", "--random-state", "1", "--auc")
    assert out.returncode == 0, out.stderr
    assert "10-NN accuracy" in out.stdout and "R_NX AUC" in out.stdout
    expected = ge.TSNE(2, 10.0, max_iter=20, tol=1e-4, random_state=1,
                       backend="cpu").fit_transform(X)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-9,
                               atol=1e-12 * np.abs(expected).max())


def test_embed_passes_iteration_limit_and_seed(tmp_path):
    """The CLI's result equals the estimator's with the same settings."""
    import gpuembed as ge

    X = np.random.default_rng(0).standard_normal((120, 5))
    np.save(tmp_path / "x.npy", X)
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                  "--backend", "cpu", "--method", "ee", "--perplexity", "10", "--max-iter", "3",
                  "--random-state", "4")
    assert out.returncode == 0, out.stderr
    expected = ge.EE(2, 10.0, max_iter=3, tol=1e-4, random_state=4,
                     backend="cpu").fit_transform(X)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-12)
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                  "--backend", "cpu", "--max-iter", "0")
    assert out.returncode == 1 and "max_iter" in out.stderr and "Traceback" not in out.stderr


def test_embed_multiscale_sne_keeps_its_defaults(tmp_path):
    """--method msne: the options left unset keep MultiscaleSNE's defaults (not the
    SNE family's perplexity 30 and SD); those given pass through."""
    import gpuembed as ge

    X = np.random.default_rng(0).standard_normal((150, 5))
    np.save(tmp_path / "x.npy", X)
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                  "--backend", "cpu", "--method", "msne", "--max-iter", "5")
    assert out.returncode == 0, out.stderr
    expected = ge.MultiscaleSNE(2, max_iter=5, backend="cpu").fit_transform(X)
    # Another process: the parallel sweeps' sums may round differently.
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, rtol=1e-9,
                               atol=1e-12 * np.abs(expected).max())
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy"),
                  "--backend", "cpu", "--method", "msne", "--optimizer", "sd")
    assert out.returncode == 1 and "optimizer" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("args", [[], ["nonsense"], ["demo", "--dataset", "nope"],
                                  ["embed"], ["demo", "--backend", "tpu"],
                                  ["demo", "--perplexity", "abc"], ["demo", "--optimizer", "adam"]])
def test_argument_errors_print_usage(args):
    out = run_cli(*args)
    assert out.returncode == 2
    assert "usage: gpuembed" in out.stderr and "Traceback" not in out.stderr


def test_embed_plots_named_labels_and_checks_the_plot_first(tmp_path):
    """Labels that are names colour the plot (matplotlib refused them as colours,
    after the fit); a plot path without a suffix gets matplotlib's PNG suffix,
    said as written; a format matplotlib cannot write fails before the fit."""
    pytest.importorskip("matplotlib")
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((60, 3)))
    np.save(tmp_path / "y.npy", np.array(["cat", "dog", "owl"])[np.arange(60) % 3])
    embed = ("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy"), "--backend",
             "cpu", "--method", "ee", "--max-iter", "3")
    out = run_cli(*embed, "--labels", str(tmp_path / "y.npy"), "--plot", str(tmp_path / "p"))
    assert out.returncode == 0, out.stderr
    assert f"wrote {tmp_path / 'p.png'}" in out.stdout
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = run_cli(*embed, "--plot", str(tmp_path / "p.txt"))
    assert out.returncode == 1 and "--plot: matplotlib cannot write .txt" in out.stderr
    assert "points in" not in out.stdout


def test_demo_checks_its_output_before_it_fits(tmp_path):
    out = run_cli("demo", "--backend", "cpu", "-o", str(tmp_path / "no" / "demo.png"))
    assert out.returncode == 1 and "no such directory" in out.stderr
    assert "accuracy" not in out.stdout


def test_runtime_errors_have_no_traceback(tmp_path):
    out = run_cli("embed", str(tmp_path / "missing.npy"), "-o", str(tmp_path / "o.npy"))
    assert out.returncode == 1 and "error" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "bad.txt").write_text("1,2")
    out = run_cli("embed", str(tmp_path / "bad.txt"), "-o", str(tmp_path / "o.npy"))
    assert out.returncode == 1 and ".npy, .csv or .npz" in out.stderr
    np.savez(tmp_path / "arrays.npz", x=np.ones((5, 2)))        # not scipy.sparse.save_npz's
    out = run_cli("embed", str(tmp_path / "arrays.npz"), "-o", str(tmp_path / "o.npy"))
    assert out.returncode == 1 and "save_npz" in out.stderr and "Traceback" not in out.stderr
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((50, 3)))
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy"),
                  "--method", "ee", "--optimizer", "tsne", "--backend", "cpu")
    assert out.returncode == 1 and "optimizer" in out.stderr and "Traceback" not in out.stderr
    # A .csv without rows (empty, or a header alone): the error, not NumPy's warning too.
    for text in ("", "a,b,c\n"):
        (tmp_path / "empty.csv").write_text(text)
        out = run_cli("embed", str(tmp_path / "empty.csv"), "-o", str(tmp_path / "o.npy"))
        assert out.returncode == 1 and "INPUT needs at least 1 samples" in out.stderr
        assert "Warning" not in out.stderr, out.stderr


def test_embed_reads_labels_from_text_files(tmp_path):
    """--labels takes a .csv or .txt file of one label per line, numbers (after an
    optional header line) or names, as well as .npy: np.load had taken a text
    file for a pickle and answered with NumPy's advice on allow_pickle.  Other
    files, and lines of several fields, are refused before the fit."""
    X, y = ge.datasets.gaussian_clusters(90, 3, 4, random_state=0)
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", y)
    (tmp_path / "y.csv").write_text("label\n" + "\n".join(map(str, y)) + "\n")
    (tmp_path / "names.txt").write_text("\n".join(np.array(["a", "b", "c"])[y]))
    embed = ("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy"), "--backend", "cpu",
             "--method", "ee", "--max-iter", "20", "--labels")
    accuracies = set()
    for name in ("y.npy", "y.csv", "names.txt"):
        out = run_cli(*embed, str(tmp_path / name))
        assert out.returncode == 0, out.stderr
        accuracies.add(re.search(r"10-NN accuracy (\S+)", out.stdout).group(1))
    assert accuracies == {"1.000"}
    (tmp_path / "two.csv").write_text("\n".join(f"{k},{k}" for k in y))
    (tmp_path / "y.json").write_text("[]")
    for name, message in (("two.csv", "one label per line"), ("y.json", ".npy, .csv or .txt")):
        out = run_cli(*embed, str(tmp_path / name))
        assert out.returncode == 1 and message in out.stderr and "points in" not in out.stdout


def test_embed_checks_before_it_fits(tmp_path):
    """A labels file of the wrong length or shape or with NaN (missing labels: NumPy's
    unique had made them a class) or an output in a missing folder fails at
    once, not after the fit; a CSV may start with a header line."""
    X = np.random.default_rng(0).random((50, 3))
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", np.arange(10))
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy"),
                  "--labels", str(tmp_path / "y.npy"), "--backend", "cpu")
    assert out.returncode == 1 and "got shape (10,)" in out.stderr
    assert "points in" not in out.stdout            # failed before the fit
    np.save(tmp_path / "y2.npy", X)                 # one row per point, but 2-D
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy"),
                  "--labels", str(tmp_path / "y2.npy"), "--backend", "cpu")
    assert out.returncode == 1 and "--labels must be a 1-D array" in out.stderr
    assert "points in" not in out.stdout and "Traceback" not in out.stderr
    np.save(tmp_path / "y3.npy", np.where(np.arange(50) % 7 == 0, np.nan, 1.0))
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.npy"),
                  "--labels", str(tmp_path / "y3.npy"), "--backend", "cpu")
    assert out.returncode == 1 and "--labels contains NaN at 8 point(s)" in out.stderr
    assert "points in" not in out.stdout and "Traceback" not in out.stderr
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "no" / "o.npy"),
                  "--backend", "cpu")
    assert out.returncode == 1 and "no such directory" in out.stderr
    assert "points in" not in out.stdout            # failed before the fit
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.txt"),
                  "--backend", "cpu")
    assert out.returncode == 1 and "--output must end in .npy or .csv" in out.stderr
    assert "points in" not in out.stdout and not list(tmp_path.glob("o.txt*"))
    # The data's shape and values are checked (naming INPUT) before anything is said
    # of the parameters: a 3-D array had first been told its perplexity was lowered.
    np.save(tmp_path / "x3.npy", X.reshape(50, 3, 1))
    out = run_cli("embed", str(tmp_path / "x3.npy"), "-o", str(tmp_path / "o.npy"),
                  "--backend", "cpu")
    assert out.returncode == 1 and "INPUT must be 2-D" in out.stderr
    assert "lowered" not in out.stderr and "Traceback" not in out.stderr
    np.savetxt(tmp_path / "x.csv", X, delimiter=",", header="a,b,c", comments="")
    out = run_cli("embed", str(tmp_path / "x.csv"), "-o", str(tmp_path / "o.npy"),
                  "--backend", "cpu", "--method", "ee", "--max-iter", "3", "--random-state", "1")
    assert out.returncode == 0, out.stderr
    run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "p.npy"),
            "--backend", "cpu", "--method", "ee", "--max-iter", "3", "--random-state", "1")
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), np.load(tmp_path / "p.npy"))
    assert "perplexity 30 lowered to 16" in out.stderr
    # A .csv output is text, the same numbers to the last bit (np.save would have
    # written o.csv.npy).
    out = run_cli("embed", str(tmp_path / "x.npy"), "-o", str(tmp_path / "o.csv"),
                  "--backend", "cpu", "--method", "ee", "--max-iter", "3", "--random-state", "1")
    assert out.returncode == 0 and f"wrote {tmp_path / 'o.csv'}" in out.stdout, out.stderr
    np.testing.assert_array_equal(np.loadtxt(tmp_path / "o.csv", delimiter=","),
                                  np.load(tmp_path / "p.npy"))

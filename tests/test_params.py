"""scikit-learn conventions: get_params / set_params, clone, Pipeline, repr."""
import inspect

import numpy as np
import pytest

import gpuembed as ge

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils import estimator_checks  # noqa: E402

# scikit-learn's estimator tags (``__sklearn_tags__``), which its checks of 1.6 on
# ask for; before, they asked for BaseEstimator's ``_get_tags``.
needs_tags = pytest.mark.skipif(not hasattr(sklearn.utils, "Tags"),
                                reason="needs scikit-learn 1.6 or later (estimator tags)")

ESTIMATORS = [
    ge.TSNE(perplexity=5, kappa=3), ge.SSNE(optimizer="lbfgs"), ge.SNE(init="random"),
    ge.EE(lambda_=0.5, homotopy=True), ge.MultiscaleSNE(n_scales=3),
    ge.LaplacianEigenmaps(3, n_neighbors=10, n_landmarks=50),
    ge.SpectralClustering(4, n_neighbors=10), ge.ParametricEmbedding(ge.EE(lambda_=2.0), "rbf"),
]


@pytest.mark.parametrize("est", ESTIMATORS, ids=lambda e: type(e).__name__)
def test_clone_keeps_every_parameter(est):
    params = est.get_params(deep=False)
    copy = clone(est)
    assert type(copy) is type(est)
    for name, value in copy.get_params(deep=False).items():
        if hasattr(value, "get_params"):            # nested estimators are cloned too
            assert value is not params[name]
            assert value.get_params() == params[name].get_params()
        else:
            assert value is params[name], name


def test_set_params_and_its_errors():
    model = ge.TSNE().set_params(perplexity=5.0, kappa=3, max_iter=10)
    assert model.perplexity == 5.0 and model.max_iter == 10
    assert model.get_params()["kappa"] == 3
    assert "method_params" not in vars(model)       # only parameters are attributes
    with pytest.raises(ValueError, match="invalid parameter 'perplexty' for TSNE"):
        model.set_params(perplexty=5)
    pe = ge.ParametricEmbedding(ge.EE()).set_params(embedding__lambda_=2.0, n_mu=3)
    assert pe.embedding.lambda_ == 2.0 and pe.n_mu == 3
    assert pe.get_params()["embedding__lambda_"] == 2.0
    assert repr(ge.TSNE(perplexity=5, kappa=3)) == "TSNE(perplexity=5, kappa=3)"
    assert repr(ge.LaplacianEigenmaps(n_neighbors=10)) == "LaplacianEigenmaps(n_neighbors=10)"


def test_pipeline_fits_like_the_estimator():
    X, _ = ge.datasets.gaussian_clusters(200, 3, 8, random_state=0)
    X = X * np.arange(1, 9)                       # features on different scales
    params = dict(perplexity=10, max_iter=50, random_state=0, backend="cpu")
    piped = make_pipeline(StandardScaler(), ge.TSNE(**params)).fit_transform(X, np.zeros(200))
    direct = ge.TSNE(**params).fit_transform(StandardScaler().fit_transform(X))
    np.testing.assert_array_equal(piped, direct)
    labels = make_pipeline(StandardScaler(), ge.SpectralClustering(
        3, n_neighbors=10, random_state=0, backend="cpu")).fit_predict(X)
    assert len(np.unique(labels)) == 3


def test_text_pipeline_embeds_sparse_tfidf_rows():
    """TfidfVectorizer's sparse rows straight into t-SNE: documents of three
    topics (15 topic words and 20 shared ones each) separate."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    rng = np.random.default_rng(0)
    topics = [[f"t{t}w{i}" for i in range(30)] for t in range(3)]
    common = [f"c{i}" for i in range(50)]
    labels = np.arange(150) % 3
    docs = [" ".join([*rng.choice(topics[t], 15), *rng.choice(common, 20)]) for t in labels]
    Y = make_pipeline(TfidfVectorizer(), ge.TSNE(perplexity=10, backend="cpu",
                                                 random_state=0)).fit_transform(docs)
    assert ge.metrics.knn_accuracy(Y, labels) >= 0.95


@pytest.mark.parametrize("make", [
    lambda: ge.TSNE(max_iter=30, backend="cpu"),
    lambda: ge.EE(max_iter=30, nbody="fgt", backend="cpu"),
    lambda: ge.SNE(max_iter=20, backend="cpu"),
    lambda: ge.MultiscaleSNE(max_iter=5, backend="cpu"),
    lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=40, backend="cpu"),
    lambda: ge.SpectralClustering(3, n_neighbors=10, backend="cpu"),
    lambda: ge.ParametricEmbedding(ge.TSNE(max_iter=20, backend="cpu"), "mlp", n_mu=2)],
    ids=["TSNE", "EE", "SNE", "MultiscaleSNE", "LaplacianEigenmaps", "SpectralClustering",
         "ParametricEmbedding"])
def test_fitted_models_pickle(make):
    """A fitted model saved with pickle (joblib alike) gives the same results; the
    SNE family's copy leaves its affinity pairs behind (a few times X's size)."""
    import pickle

    X, _ = ge.datasets.gaussian_clusters(300, 3, 5, random_state=0)
    est = make().fit(X)
    data = pickle.dumps(est)
    loaded = pickle.loads(data)
    for name in ("embedding_", "labels_"):
        if hasattr(est, name):
            np.testing.assert_array_equal(getattr(loaded, name), getattr(est, name))
    if hasattr(est, "transform"):
        np.testing.assert_array_equal(loaded.transform(X[:7]), est.transform(X[:7]))
    if isinstance(est, (ge.TSNE, ge.EE, ge.SNE)):
        assert len(data) < 4 * X.nbytes + 50_000


def test_grid_search_over_perplexity():
    """GridSearchCV clones, sets parameters and scores held-out folds by
    transform; scikit-learn 1.6+ asks for the estimator's tags first."""
    from sklearn.model_selection import GridSearchCV

    X, y = ge.datasets.gaussian_clusters(200, 3, 6, random_state=0)

    def heldout_accuracy(est, X_test, y_test):
        return ge.metrics.knn_accuracy(est.transform(X_test), y_test, k=5)

    search = GridSearchCV(ge.TSNE(max_iter=30, backend="cpu", random_state=0),
                          {"perplexity": [5.0, 10.0]}, scoring=heldout_accuracy, cv=2)
    search.fit(X, y)
    assert search.best_params_["perplexity"] in (5.0, 10.0)
    assert search.best_score_ >= 0.9


@needs_tags
def test_tags_say_which_take_sparse_input():
    assert ge.TSNE().__sklearn_tags__().input_tags.sparse
    assert not ge.ParametricEmbedding().__sklearn_tags__().input_tags.sparse


# scikit-learn's estimator checks the estimators fail by design, with the reason.
_TRANSFORM_OF_TRAINING_POINTS = (
    "transform places a training point as a new point against the fitted layout, which is "
    "not its fitted position (scikit-learn's TSNE has no transform at all)")
_NOT_SCIKIT_LEARNS_CLASS = (
    "a method before fit raises ge.NotFittedError, a ValueError and an AttributeError as "
    "scikit-learn's is, not scikit-learn's class itself: gpuembed does not import it")
_BY_DESIGN = {
    "check_do_not_raise_errors_in_init_or_set_params":
        "an unknown **method_params name is refused at construction, where the typo is",
    "check_n_features_in_after_fitting":
        "the new data's argument is X_new (Y_new), which the message names",
    "check_transformer_general": _TRANSFORM_OF_TRAINING_POINTS,
    "check_transformer_data_not_an_array": _TRANSFORM_OF_TRAINING_POINTS,
    "check_estimators_unfitted": _NOT_SCIKIT_LEARNS_CLASS,
    "check_get_feature_names_out_error": _NOT_SCIKIT_LEARNS_CLASS,
}


@pytest.mark.parametrize("est", [
    ge.TSNE(max_iter=20, perplexity=5, random_state=0, backend="cpu"),
    ge.EE(max_iter=20, perplexity=5, random_state=0, backend="cpu"),
    ge.SNE(max_iter=10, perplexity=5, random_state=0, backend="cpu"),
    ge.MultiscaleSNE(max_iter=5, random_state=0, backend="cpu"),
    ge.LaplacianEigenmaps(2, n_neighbors=5, backend="cpu"),
    ge.SpectralClustering(3, n_neighbors=5, random_state=0, backend="cpu"),
    ge.ParametricEmbedding(ge.EE(max_iter=20, perplexity=5, random_state=0, backend="cpu"),
                           "linear", random_state=0)],
    ids=lambda e: type(e).__name__)
@needs_tags
def test_scikit_learn_estimator_checks(est):
    """scikit-learn's own check_estimator: input validation and messages, unfitted
    errors, n_features_in_, cloning, pickling, subset invariance of transform...;
    every failure is one listed in _BY_DESIGN."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = estimator_checks.check_estimator(est, on_fail=None,
                                                   expected_failed_checks=_BY_DESIGN)
    failed = [(r["check_name"], str(r["exception"])[:300]) for r in results
              if r["status"] == "failed"]
    assert not failed
    assert len(results) > 40


_TRANSFORMERS = [
    ge.TSNE(max_iter=20, perplexity=5, random_state=0, backend="cpu"),
    ge.MultiscaleSNE(max_iter=5, random_state=0, backend="cpu"),
    ge.LaplacianEigenmaps(2, n_neighbors=5, backend="cpu"),
    ge.ParametricEmbedding(ge.EE(max_iter=20, perplexity=5, random_state=0, backend="cpu"),
                           "linear", random_state=0)]


@pytest.mark.parametrize("library,checks", [
    ("pandas", ("check_set_output_transform", "check_set_output_transform_pandas",
                "check_global_output_transform_pandas",
                "check_transformer_get_feature_names_out",
                "check_transformer_get_feature_names_out_pandas",
                "check_dataframe_column_names_consistency")),
    ("polars", ("check_set_output_transform_polars",
                "check_global_set_output_transform_polars"))])
@pytest.mark.parametrize("est", _TRANSFORMERS, ids=lambda e: type(e).__name__)
# Some of the checks fit on a DataFrame and transform an array or the other way round.
@pytest.mark.filterwarnings("ignore:X (does not have valid|has) feature names:UserWarning")
@needs_tags
def test_scikit_learns_output_checks(est, library, checks):
    """scikit-learn's checks of set_output, get_feature_names_out and
    feature_names_in_, which its check_estimator does not run on these
    estimators: the same values in every container, a pandas input's index kept,
    the global setting followed, the names out and input_features, the names in
    kept and new data's names checked with its messages (polars where it is
    installed; pandas is in the test extras)."""
    pytest.importorskip(library)
    for check in checks:
        getattr(estimator_checks, check)(type(est).__name__, est)


def test_set_output_in_a_pipeline():
    """A Pipeline of an embedding takes set_output (it was refused): DataFrames of
    columns tsne0, tsne1 indexed as the input, from fit_transform and transform;
    clone keeps the setting, "default" gives arrays back, and the global
    set_config(transform_output="pandas") applies where no setting is given."""
    pd = pytest.importorskip("pandas")
    X = ge.datasets.digits()[0][:200]
    frame = pd.DataFrame(X, index=np.arange(200) * 3)
    pipe = make_pipeline(StandardScaler(), ge.TSNE(max_iter=20, backend="cpu", random_state=0))
    out = pipe.set_output(transform="pandas").fit_transform(frame)
    assert isinstance(out, pd.DataFrame) and list(out.columns) == ["tsne0", "tsne1"]
    np.testing.assert_array_equal(out.index, frame.index)
    np.testing.assert_array_equal(out.to_numpy(), pipe[-1].embedding_)
    assert list(pipe.get_feature_names_out()) == ["tsne0", "tsne1"]
    new = pipe.transform(frame.iloc[:5])
    assert isinstance(new, pd.DataFrame) and list(new.index) == [0, 3, 6, 9, 12]
    assert clone(pipe[-1])._sklearn_output_config == {"transform": "pandas"}
    # The scaler's DataFrame had names (x0, x1, ...), its arrays have none.
    with pytest.warns(UserWarning, match="X does not have valid feature names"):
        assert isinstance(pipe.set_output(transform="default").transform(X[:5]), np.ndarray)
    model = ge.LaplacianEigenmaps(3, n_neighbors=10, backend="cpu")
    with sklearn.config_context(transform_output="pandas"):
        assert list(model.fit_transform(X).columns) == [f"laplacianeigenmaps{i}"
                                                        for i in range(3)]
    assert isinstance(model.fit_transform(X), np.ndarray)


def test_columns_of_new_data_are_checked_against_those_fitted():
    """A DataFrame's column names are kept (feature_names_in_) and new data's are
    checked by transform and SpectralClustering.predict: reordered columns, which
    had been embedded or clustered silently as other features, raise
    scikit-learn's ValueError; plain arrays after a DataFrame, or the other
    way round, warn; refitting on an array drops the names; mixed name types
    raise scikit-learn's TypeError at fit."""
    pd = pytest.importorskip("pandas")
    X = np.random.default_rng(0).random((150, 6))
    frame = pd.DataFrame(X, columns=[f"pixel{i}" for i in range(6)])
    model = ge.LaplacianEigenmaps(2, n_neighbors=10, backend="cpu").fit(frame)
    np.testing.assert_array_equal(model.feature_names_in_, frame.columns)
    assert model.feature_names_in_.dtype == object
    new = model.transform(frame.iloc[:5])
    with pytest.raises(ValueError, match="must be in the same order as they were in fit"):
        model.transform(frame[frame.columns[::-1]].iloc[:5])
    with pytest.raises(ValueError, match="unseen at fit time:\n- other"):
        model.transform(frame.rename(columns={"pixel0": "other"}))
    with pytest.warns(UserWarning, match="X does not have valid feature names, but "
                                         "LaplacianEigenmaps was fitted with feature names"):
        np.testing.assert_array_equal(model.transform(X[:5]), new)
    model.fit(X)
    assert not hasattr(model, "feature_names_in_")
    with pytest.warns(UserWarning, match="X has feature names, but LaplacianEigenmaps was "
                                         "fitted without"):
        model.transform(frame.iloc[:5])
    with pytest.raises(TypeError, match="Feature names are only supported if all"):
        ge.TSNE(max_iter=5, backend="cpu").fit(frame.set_axis([0, 1, 2, "a", "b", "c"],
                                                              axis=1))
    clusters = ge.SpectralClustering(3, n_neighbors=10, random_state=0, backend="cpu")
    labels = clusters.fit_predict(frame)
    np.testing.assert_array_equal(clusters.feature_names_in_, frame.columns)
    np.testing.assert_array_equal(clusters.predict(frame.iloc[:7]), labels[:7])
    with pytest.raises(ValueError, match="must be in the same order as they were in fit"):
        clusters.predict(frame[frame.columns[::-1]])
    estimator_checks.check_dataframe_column_names_consistency("SpectralClustering", clusters)


def test_output_api_messages():
    with pytest.raises(ValueError, match="transform must be one of"):
        ge.TSNE().set_output(transform="xarray")
    with pytest.raises(ge.NotFittedError, match="get_feature_names_out"):
        ge.TSNE().get_feature_names_out()
    X = np.random.default_rng(0).random((30, 20))
    model = ge.LaplacianEigenmaps(2, n_neighbors=5, backend="cpu").fit(X)
    with pytest.raises(ValueError, match=r"input_features should have length equal to "
                                         r"number of features \(20\), got 3"):
        model.get_feature_names_out(["a", "b", "c"])
    assert not hasattr(ge.SpectralClustering(2, n_neighbors=5), "set_output")   # no transform


def test_transform_of_a_point_does_not_depend_on_the_batch():
    """Each new point stops on its own test: transforming it alone or with others
    gives the same position (a shared stopping test moved converged points on).
    The same up to the last bits of its k-NN distances, which the GEMM rounds
    differently with other rows in the block (2e-13 here): multi-scale SNE's
    flatter per-point cost carries that to about 1e-9 of the layout's spread."""
    X, _ = ge.datasets.gaussian_clusters(300, 3, 5, random_state=0)
    for est, rtol in ((ge.TSNE(max_iter=50, backend="cpu", random_state=0), 1e-12),
                      (ge.EE(max_iter=50, backend="cpu", random_state=0), 1e-12),
                      (ge.MultiscaleSNE(max_iter=10, n_scales=3, backend="cpu"), 1e-7)):
        est.fit(X[:250])
        together = est.transform(X[250:])
        spread = np.ptp(est.embedding_)
        for i in (0, 17, 49):
            np.testing.assert_allclose(est.transform(X[250 + i:251 + i])[0], together[i],
                                       rtol=rtol, atol=rtol * spread)


def test_memory_order_of_the_rows_does_not_change_a_fit():
    """A Fortran-ordered X (a pandas DataFrame's values, often) or a strided view
    gives the bits of its C-ordered copy: checked data comes in C order, where BLAS
    had taken Fortran order the other way round, with other last bits that
    t-SNE's path grew (float32 digits: layouts 0.35 apart)."""
    X = ge.datasets.digits()[0][:400].astype(np.float32)
    wide = np.zeros((X.shape[0], 2 * X.shape[1]), dtype=X.dtype)
    wide[:, ::2] = X
    fits = (lambda Z: ge.TSNE(max_iter=100, random_state=0, backend="cpu").fit_transform(Z),
            lambda Z: ge.ParametricEmbedding(ge.EE(max_iter=30, random_state=0, backend="cpu"),
                                             "mlp", random_state=0).fit(Z).transform(Z))
    for fit in fits:
        expected = fit(np.ascontiguousarray(X))
        for Z in (np.asfortranarray(X), wide[:, ::2]):
            np.testing.assert_array_equal(fit(Z), expected)


def test_table_like_input_and_unfitted_errors():
    """Objects with a shape but no dtype (pandas DataFrames) and object arrays of
    numbers are read as numbers; complex data and non-numbers are refused; a
    transform before fit raises NotFittedError, a ValueError and AttributeError."""
    from gpuembed._checks import check_data

    class Table:                    # a DataFrame's array protocol, without pandas
        shape = (6, 2)

        def __array__(self, dtype=None, copy=None):
            return np.arange(12.0).reshape(6, 2)

    class Tensor(Table):            # another library's array: a dtype numpy does not know
        dtype = "float64 of another library"

    be = ge.get_backend("cpu")
    for table in (Table(), Tensor()):
        np.testing.assert_array_equal(check_data(table, be), np.arange(12.0).reshape(6, 2))
    mixed = np.array([[1, 2.5], [3, 4.0], [5, 6.5]], dtype=object)
    assert check_data(mixed, be).dtype == np.float64
    mixed[0, 0] = {"a": 1}
    with pytest.raises(TypeError, match="X must be numeric: float.. argument must be"):
        check_data(mixed, be)
    # Missing values (a nullable pandas column's NA): the message had been float()'s.
    mixed[0, 0], mixed[2, 1] = None, type("NAType", (), {})()
    with pytest.raises(ValueError, match=r"X contains 2 missing value\(s\) \(None or "
                                         r"pandas' NA\)"):
        check_data(mixed, be)
    with pytest.raises(ValueError, match="X: Complex data not supported"):
        check_data(np.ones((3, 2)) * 1j, be)
    with pytest.raises(ValueError, match="X has 0 feature"):
        check_data(np.ones((3, 0)), be)
    with pytest.raises(ValueError, match="Reshape your data"):
        check_data(np.ones(3), be)
    for est in (ge.TSNE(), ge.LaplacianEigenmaps(n_neighbors=3), ge.ParametricEmbedding()):
        with pytest.raises(ge.NotFittedError, match="not fitted yet"):
            est.transform(np.ones((2, 3)))
        assert not hasattr(est, "n_features_in_")
    assert issubclass(ge.NotFittedError, ValueError)
    assert issubclass(ge.NotFittedError, AttributeError)
    est = ge.TSNE(max_iter=5, perplexity=3, backend="cpu")
    est.fit(np.random.default_rng(0).random((20, 3)))
    assert est.n_features_in_ == 3
    with pytest.raises(ValueError, match="X_new has 2 features, but TSNE is expecting 3"):
        est.transform(np.ones((2, 2)))


@pytest.mark.gpu
def test_device_arrays_of_other_libraries_stay_on_the_device():
    """An object with only the CUDA array interface (a PyTorch or Numba device
    array) is taken on the GPU without a copy through the host."""
    from gpuembed._checks import check_data

    be = ge.get_backend("gpu")
    a = be.asarray(np.arange(12.0).reshape(6, 2))

    class Foreign:
        __cuda_array_interface__ = a.__cuda_array_interface__

    X = check_data(Foreign(), be)
    pointer = lambda v: v.__cuda_array_interface__["data"][0]
    assert X.dtype == np.float64 and pointer(X) == pointer(a)
    np.testing.assert_array_equal(be.to_host(X), np.arange(12.0).reshape(6, 2))


def _doc_section(doc, title):
    """The lines of numpydoc section ``title`` of a docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    start = lines.index(title) + 2                       # past the title and its underline
    end = next((i - 1 for i in range(start + 1, len(lines))
                if set(lines[i]) == {"-"} and lines[i - 1]), len(lines))
    return lines[start:end]


def _entries(section):
    """The names an entry documents: ``name : ...`` or ``a, b : ...`` at the margin."""
    return {name.strip() for line in section if line and not line[0].isspace()
            for name in line.split(" : ")[0].split(",")}


@pytest.mark.parametrize("make", [
    lambda: ge.TSNE(max_iter=5, perplexity=5, backend="cpu"),
    lambda: ge.SSNE(max_iter=5, perplexity=5, backend="cpu"),
    lambda: ge.SNE(max_iter=5, perplexity=5, backend="cpu"),
    lambda: ge.EE(max_iter=5, perplexity=5, backend="cpu"),
    lambda: ge.MultiscaleSNE(max_iter=3, backend="cpu"),
    lambda: ge.LaplacianEigenmaps(2, n_neighbors=10, n_landmarks=40, backend="cpu"),
    lambda: ge.SpectralClustering(3, n_neighbors=10, n_landmarks=40, backend="cpu"),
    lambda: ge.ParametricEmbedding(ge.EE(max_iter=5, perplexity=5, backend="cpu"), "linear",
                                   n_mu=2)],
    ids=lambda make: type(make()).__name__)
def test_docstrings_document_every_parameter_and_fitted_attribute(make):
    """help(estimator) names every parameter (the method parameters included, each
    as ``name``) and every public attribute that fit sets."""
    from gpuembed.embedding import METHOD_PARAMS

    model = make()
    doc = type(model).__doc__
    parameters = _entries(_doc_section(doc, "Parameters"))
    missing = set(model._param_names()) - parameters
    if "**method_params" in parameters:
        missing |= {name for name in METHOD_PARAMS if f"``{name}``" not in doc}
    assert not missing
    X, _ = ge.datasets.gaussian_clusters(150, 3, 5, random_state=0)
    model.fit(X)
    fitted = {name for name in vars(model) if name.endswith("_") and not name.startswith("_")
              and name not in model._param_names()}
    assert fitted - _entries(_doc_section(doc, "Attributes")) == set()


def _public_callables():
    """The functions and classes of the public modules (their __all__)."""
    seen = {}
    for module in (ge, ge.metrics, ge.datasets, ge.spectral):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or inspect.isclass(obj):
                seen.setdefault(id(obj), (f"{module.__name__}.{name}", obj))
    seen[id(ge.objectives.value_and_grad)] = ("objectives.value_and_grad",
                                             ge.objectives.value_and_grad)
    seen[id(ge.nbody.kernel_sums)] = ("nbody.kernel_sums", ge.nbody.kernel_sums)
    return sorted(seen.values(), key=lambda pair: pair[0])


@pytest.mark.parametrize("name, obj", _public_callables(),
                         ids=[name for name, _ in _public_callables()])
def test_public_functions_name_every_parameter_in_their_docstrings(name, obj):
    """Every parameter of a public function (of a class: of __init__ and its public
    methods, in the class's docstring or the method's) is named in its docstring."""
    import re

    methods = [(obj, obj.__doc__)] if inspect.isfunction(obj) else [
        (f, (obj.__doc__ or "") + (f.__doc__ or "")) for n, f in vars(obj).items()
        if inspect.isfunction(f) and (n == "__init__" or not n.startswith("_"))]
    missing = []
    for function, doc in methods:
        for p in inspect.signature(function).parameters.values():
            if p.name in ("self", "y") or p.kind is p.VAR_KEYWORD and p.name == "kwargs":
                continue
            if not re.search(rf"\b{p.name}\b", doc or ""):
                missing.append(f"{function.__name__}({p.name})")
    assert not missing, name

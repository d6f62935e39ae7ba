"""The emulated CuPy (tests/emulated_cupy.py) refuses what CuPy refuses and
accepts what CuPy accepts, so GPU code that mixes host and device data fails
in CI instead of on the first GPU run."""
import numpy as np
import pytest
import scipy.sparse

import emulated_cupy
from emulated_cupy import DeviceArray, DeviceSparse
from emulated_cupy import cupy as xp


@pytest.fixture
def a():
    return xp.arange(5.0)


@pytest.mark.parametrize("expression", [
    lambda a: a + np.ones(5),
    lambda a: np.ones(5) * a,
    lambda a: xp.maximum(a, np.ones(5)),
    lambda a: xp.where(a > 1, a, np.zeros(5)),
    lambda a: xp.concatenate([a, np.ones(2)]),
    lambda a: xp.maximum(a, [1.0, 2.0, 3.0, 4.0, 5.0]),      # lists are host data too
    lambda a: a + np.array(1.0),                            # so is a 0-d host array
])
def test_host_arrays_are_refused_where_cupy_wants_device_arrays(a, expression):
    with pytest.raises(TypeError, match="Unsupported type"):
        expression(a)


def test_device_arrays_are_refused_where_host_code_wants_numpy(a):
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(ValueError, match="unrecognized"):   # SciPy catches the TypeError
        scipy.sparse.csr_matrix(xp.ones((2, 2)))
    with pytest.raises(TypeError):          # cupy.ndarray has no __index__
        [0, 1, 2][a[1].astype(xp.int64)]
    assert not isinstance(a, np.ndarray)


def test_assignment_follows_cupy(a):
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray"):
        a[1:3] = np.ones(2)                 # basic slice: CuPy calls fill()
    a[np.array([1, 2])] = np.array([7.0, 8.0])   # advanced index: converted
    a[0] = np.float64(9.0)
    a[3:] = np.array(6.0)                   # a 0-d host array fills
    np.testing.assert_array_equal(a.get(), [9.0, 7.0, 8.0, 6.0, 6.0])


def test_what_cupy_accepts_works(a):
    b = xp.asarray(np.arange(5.0))          # host-to-device copies
    s = a.sum()
    assert isinstance(s, DeviceArray) and s.ndim == 0   # reductions stay on the device
    assert float(s) == 10.0 and bool(s > 0) and int(a[2]) == 2
    assert isinstance(np.sqrt(a), DeviceArray)          # __array_ufunc__
    assert isinstance(np.concatenate([a, b]), DeviceArray)   # __array_function__
    assert float(a[np.array([4])][0]) == 4.0             # host index arrays
    c = a * 2.0 + np.float32(1.0)
    c += b
    np.testing.assert_array_equal(xp.asnumpy(c), 3.0 * np.arange(5.0) + 1.0)
    assert f"{s:.1f}" == "10.0"


def test_names_and_keywords_cupy_lacks_are_refused(a):
    with pytest.raises(AttributeError, match="geomspace"):
        xp.geomspace(1.0, 2.0, 3)           # NumPy has it, CuPy 14 does not
    with pytest.raises(AttributeError, match="ctypes"):
        a.ctypes
    with pytest.raises(TypeError, match="initial"):
        xp.sum(a, initial=0.0)              # a NumPy keyword CuPy's sum lacks
    with pytest.raises(AttributeError, match="resize"):
        emulated_cupy.sparse.csr_matrix(scipy.sparse.eye(3, format="csr")).resize((4, 4))


def test_only_what_the_oldest_and_a_recent_cupy_both_have_is_taken(a):
    """The API is the recorded releases' common part: CuPy 14's put_along_axis and
    its sparse astype's copy= are refused (13.0 has neither: the default SD and
    R_NX failed there), astype's dtype still passes by position."""
    assert emulated_cupy.API["cupy_version"] == "13.0.0 and 14.2.0"
    with pytest.raises(AttributeError, match="put_along_axis"):
        xp.put_along_axis
    M = emulated_cupy.sparse.csr_matrix(scipy.sparse.eye(3, format="csr"))
    with pytest.raises(TypeError, match="copy"):
        M.astype(np.float32, copy=False)
    assert M.astype(np.float32).dtype == np.float32
    common = emulated_cupy._common_parameters
    assert common(["self", "t"], ["self", "dtype", "copy"]) == ["self", "t|dtype"]
    assert common(["x", "bins", "weights", "density"], ["x", "bins", "density", "weights"]
                  ) == ["x", "bins", "weights", "density"]
    assert common(["a", "*v", "**kw"], ["a", "b", "*args", "**kwargs"]) == ["a", "b", "*v", "**kw"]
    assert common(["a", "**kw"], ["a", "*args"]) == ["a"]
    assert common(["*args", "**kwargs"], ["*args", "axes", "out"]) == ["axes", "out", "*args"]
    assert common(None, ["a"]) == ["a"]


def test_sparse_matrices_keep_data_on_the_device():
    host = scipy.sparse.random(6, 6, density=0.5, format="csr", random_state=0)
    M = emulated_cupy.sparse.csr_matrix(host)           # from SciPy: a copy to the device
    v = xp.arange(6.0)
    assert isinstance(M @ v, DeviceArray) and isinstance(M.T, DeviceSparse)
    np.testing.assert_allclose((M @ v).get(), host @ np.arange(6.0))
    M.data *= 2.0                                       # data is a view
    np.testing.assert_allclose(M.get().toarray(), 2.0 * host.toarray())
    with pytest.raises(TypeError, match="Unsupported type"):
        emulated_cupy.sparse.csr_matrix((host.data, host.indices, host.indptr))
    with pytest.raises(TypeError, match="Unsupported type"):
        M @ np.ones(6)
    solve = emulated_cupy.sparse_linalg.factorized(
        emulated_cupy.sparse.csr_matrix(scipy.sparse.identity(3, format="csr") * 2.0))
    np.testing.assert_allclose(solve(xp.ones(3)).get(), 0.5)


def test_ufunc_at_accumulates_in_place_and_wants_device_arrays():
    target = xp.zeros(3)
    xp.add.at(target, xp.asarray([0, 2, 0]), xp.asarray([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(target.get(), [4.0, 0.0, 2.0])
    with pytest.raises(TypeError, match="Unsupported type"):
        xp.add.at(np.zeros(3), xp.asarray([0]), 1.0)
    with pytest.raises(TypeError, match="Unsupported type"):
        xp.add.at(target, xp.asarray([0, 1]), np.ones(2))


def test_uploads_copy():
    """cupy.asarray of host data is a device copy: writes on either side do not
    show on the other (NumPy's asarray would share the buffer)."""
    host = np.arange(4.0)
    for upload in (xp.asarray, xp.asanyarray, xp.array):
        device = upload(host)
        device += 1.0
        np.testing.assert_array_equal(host, np.arange(4.0))
        host[0] = 7.0
        assert device.get()[0] == 1.0
        host[0] = 0.0
    fortran = np.asfortranarray(np.ones((2, 3)))
    assert xp.asarray(fortran).flags.f_contiguous


def test_counting_sees_calls_reads_and_their_gpuembed_lines(a):
    from gpuembed.nbody.exact import squared_distances

    with emulated_cupy.counting() as (counts, sites):
        b = a * 2.0 + 1.0                   # two calls
        assert float(b.sum()) == 25.0       # one call, one read
        xp.asarray(np.ones(2))              # an upload
    assert counts == {"calls": 3, "reads": 1, "uploads": 1} and sites is None
    Y, X = xp.ones((3, 2)), xp.zeros((4, 2))
    with emulated_cupy.counting(sites=True) as (counts, sites):
        squared_distances(xp, Y, X)
    assert counts["calls"] > 0 and sum(sites.values()) == counts["calls"]
    assert {site.split(":")[0] for _, site in sites} == {"nbody/exact.py", "_sparse.py"}


def test_sparse_details_follow_cupyx():
    """cupyx stores only bool and float data, and its sum_duplicates builds new
    arrays where SciPy's sorts them in place."""
    with pytest.raises(ValueError, match="Only bool, float32"):
        emulated_cupy.sparse.csr_matrix(scipy.sparse.eye(3, dtype=np.int64, format="csr"))
    host = scipy.sparse.csr_matrix((np.array([1.0, 2.0]), np.array([1, 0]), np.array([0, 2, 2])),
                                   shape=(2, 2))
    M = emulated_cupy.sparse.csr_matrix(host)
    N = emulated_cupy.sparse.csr_matrix(M, dtype=np.float32)     # shares M's indices
    N.sum_duplicates()
    np.testing.assert_array_equal(M.get().toarray(), host.toarray())
    np.testing.assert_array_equal(N.get().toarray(), host.toarray())


def test_an_emulated_graph_refuses_what_stream_capture_refuses(a):
    """Backend.capture's stand-in runs its work at each launch, device work
    only: a host read of a device value or an upload of host data raises, as
    stream capture does, and so does a cuBLAS call, as CuPy does; the emulator
    is left out of capture."""
    from emulated_cuda import EmulatedGraph

    def add_one():
        a[...] += 1.0
    graph = EmulatedGraph(add_one)
    np.testing.assert_array_equal(a.get(), np.arange(5.0))     # capture runs nothing
    with emulated_cupy.counting() as (counts, _):
        graph.launch()
        graph.launch()
    assert dict(counts) == {"graphs": 2}           # the host's calls, not the work's
    np.testing.assert_array_equal(a.get(), np.arange(5.0) + 2)
    for work in (lambda: float(a.sum()), lambda: a.get(), lambda: xp.asarray(np.ones(2))):
        with pytest.raises(RuntimeError, match="capturing"):
            EmulatedGraph(work).launch()
        assert not emulated_cupy.capturing
    M = xp.ones((3, 3))
    for work in (lambda: M @ M, lambda: xp.matmul(M, M), lambda: xp.dot(M, M)):
        with pytest.raises(NotImplementedError, match="cuBLAS"):
            EmulatedGraph(work).launch()


def test_a_csr_matrix_from_a_dense_array_has_its_rows_out_of_order():
    """As cuSPARSE's conversion leaves them (seen on an H100): the same matrix,
    each row's columns unsorted, so code that relies on their order fails here."""
    dense = np.array([[0.0, 1.0, 2.0], [3.0, 0.0, 4.0], [0.0, 0.0, 5.0]])
    M = emulated_cupy.sparse.csr_matrix(xp.asarray(dense))
    np.testing.assert_array_equal(M.toarray().get(), dense)
    np.testing.assert_array_equal(M.indices.get(), [2, 1, 2, 0, 2])
    S = emulated_cupy.sparse.csr_matrix(scipy.sparse.csr_matrix(dense))     # a copy: as stored
    np.testing.assert_array_equal(S.indices.get(), [1, 2, 0, 2, 2])

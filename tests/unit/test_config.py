"""denseccl.config: one rule per kind of setting, timedeltas and seconds alike."""

import datetime

import pytest

from denseccl import DenseCCLError, config


@pytest.mark.parametrize("word", ["1", "on", "TRUE", "yes", "always", " Always "])
def test_flag_true(word):
    assert config.flag(word, "X") is True


@pytest.mark.parametrize("word", ["0", "off", "False", "no", "never"])
def test_flag_false(word):
    assert config.flag(word, "X") is False


def test_flag_names_the_setting():
    with pytest.raises(DenseCCLError, match="DENSECCL_CHECK must be 'always' or 'off'.*'maybe'"):
        config.flag("maybe", "DENSECCL_CHECK")


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None), (0, 0.0), (2.5, 2.5), ("7", 7.0), (datetime.timedelta(minutes=2), 120.0),
        (datetime.timedelta(0), 0.0),
    ],
)
def test_seconds(value, expected):
    assert config.seconds(value, "timeout") == expected


@pytest.mark.parametrize("value", [-1, "soon", datetime.timedelta(seconds=-3), float("nan"), object()])
def test_seconds_refused(value):
    with pytest.raises(DenseCCLError, match="timeout must be"):
        config.seconds(value, "timeout")


def test_timeout_precedence(monkeypatch):
    monkeypatch.delenv("DENSECCL_TIMEOUT", raising=False)
    assert config.timeout() == config.DEFAULT_TIMEOUT
    monkeypatch.setenv("DENSECCL_TIMEOUT", "12")
    assert config.timeout() == 12.0
    assert config.timeout(datetime.timedelta(seconds=3)) == 3.0
    assert config.timeout(0) is None  # 0 waits forever
    monkeypatch.setenv("DENSECCL_TIMEOUT", "0")
    assert config.timeout() is None


def test_settings_follow_the_environment(monkeypatch):
    monkeypatch.setenv("DENSECCL_SHARED_AGREEMENT", "off")
    monkeypatch.setenv("DENSECCL_HOST_KERNELS", "NumPy")
    monkeypatch.setenv("DENSECCL_DEBUG", "trace")
    parsed = config.settings()
    assert (parsed.shared_agreement, parsed.host_kernels, parsed.debug) == (False, "numpy", "TRACE")
    assert config.settings() is parsed  # parsed once for the same values
    monkeypatch.setenv("DENSECCL_SHARED_AGREEMENT", "1")
    assert config.settings().shared_agreement is True


@pytest.mark.parametrize(
    "name, value, fragment",
    [
        ("DENSECCL_HOST_KERNELS", "fast", "DENSECCL_HOST_KERNELS must be one of auto, native, torch, numpy"),
        ("DENSECCL_DEBUG", "loud", "DENSECCL_DEBUG must be one of WARN, INFO, TRACE"),
        ("DENSECCL_TORCH_POLL", "-1", "DENSECCL_TORCH_POLL must be >= 0"),
        ("DENSECCL_TIMEOUT", "soon", "DENSECCL_TIMEOUT must be a number of seconds"),
        ("DENSECCL_ON_TIMEOUT", "explode", "DENSECCL_ON_TIMEOUT must be one of raise, abort"),
    ],
)
def test_bad_settings_name_the_variable(monkeypatch, name, value, fragment):
    monkeypatch.setenv(name, value)
    with pytest.raises(DenseCCLError, match=fragment):
        config.settings()


def test_on_timeout(monkeypatch):
    monkeypatch.delenv("DENSECCL_ON_TIMEOUT", raising=False)
    assert config.on_timeout() == "raise"  # the default: raise, and tell the peers
    monkeypatch.setenv("DENSECCL_ON_TIMEOUT", " Abort ")
    assert config.on_timeout() == "abort"
    assert config.on_timeout("raise") == "raise"  # the argument wins
    with pytest.raises(DenseCCLError, match="on_timeout must be one of raise, abort"):
        config.on_timeout("ignore")


def test_launcher_variables():
    assert config.launched_by_mpi({"PMI_RANK": "0"})
    assert config.launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    assert not config.launched_by_mpi({"RANK": "0", "WORLD_SIZE": "2"})
    assert config.local_rank({"LOCAL_RANK": "3", "MPI_LOCALRANKID": "1"}) == 3
    assert config.local_rank({"MPI_LOCALRANKID": "1"}) == 1
    assert config.local_rank({"SLURM_LOCALID": "x"}) is None
    assert config.local_rank({}) is None

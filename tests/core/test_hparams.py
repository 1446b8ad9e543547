import dataclasses
import json

import pytest

from hotloop.hparams import (HParams, HParamsError, apply_overrides, get_hparams, hparams_from_dict,
                             hparams_to_dict, parse_overrides)


@dataclasses.dataclass(frozen=True)
class ModelHParams(HParams):
    use_bias: bool = True
    sizes: tuple[int, ...] = (1, 2)
    name: str = "x"


def test_hparams_are_frozen():
    hp = HParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        hp.hidden_size = 3  # type: ignore[misc]


def test_overrides_convert_types():
    hp = apply_overrides(ModelHParams(), "learning_rate=0.5,hidden_size=650,use_bias=false,"
                                         "sizes=3:4:5,name=abc,max_steps=1e3")
    assert hp.learning_rate == 0.5 and isinstance(hp.learning_rate, float)
    assert hp.hidden_size == 650 and isinstance(hp.hidden_size, int)
    assert hp.use_bias is False and hp.sizes == (3, 4, 5) and hp.name == "abc"
    assert hp.max_steps == 1000


@pytest.mark.parametrize("text, fragment", [
    ("hiden_size=3", "unknown hparam 'hiden_size'"),
    ("hidden_size=abc", "cannot convert 'abc' to int"),
    ("hidden_size=0.5", "cannot convert '0.5' to int"),
    ("use_bias=maybe", "cannot convert 'maybe' to bool"),
    ("hidden_size", "expected key=value"),
])
def test_bad_overrides_are_clear(text, fragment):
    with pytest.raises(HParamsError, match=fragment.replace("(", r"\(")):
        apply_overrides(ModelHParams(), text)


def test_unknown_key_suggests_closest():
    with pytest.raises(HParamsError, match="did you mean 'hidden_size'"):
        apply_overrides(HParams(), "hiden_size=3")


def test_parse_overrides_ignores_blank_items():
    assert parse_overrides(" a=1, ,b = 2 ") == [("a", "1"), ("b", "2")]


def test_json_round_trip_keeps_class_and_values():
    hp = ModelHParams(hidden_size=7, sizes=(9,))
    data = json.loads(json.dumps(hparams_to_dict(hp)))
    back = hparams_from_dict(data)
    assert type(back) is ModelHParams and back == hp


def test_from_dict_rejects_unknown_fields():
    data = hparams_to_dict(HParams())
    data["bogus"] = 1
    with pytest.raises(HParamsError, match="bogus"):
        hparams_from_dict(data)


def test_named_sets_derive_from_base():
    base = get_hparams("algorithmic_base")
    tuned = get_hparams("transformer_algorithmic", "hidden_size=32")
    assert type(tuned) is type(base)
    assert tuned.hidden_size == 32

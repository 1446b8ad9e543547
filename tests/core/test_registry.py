import sys

import pytest

import hotloop
from hotloop.builtin import BUILTINS
from hotloop.registry import Registry, RegistryError, import_user_module, models, problems, registered_name


def test_duplicate_name_raises():
    reg = Registry("widget")
    reg.add("a", object())
    with pytest.raises(RegistryError, match="already registered"):
        reg.add("a", object())


def test_unknown_name_lists_names_and_suggests():
    reg = Registry("widget")
    for name in ("transformer", "mlp", "lstm_lm"):
        reg.add(name, object())
    with pytest.raises(RegistryError) as info:
        reg.get("transfomer")
    message = str(info.value)
    assert "did you mean 'transformer'" in message
    assert "lstm_lm, mlp, transformer" in message


def test_register_decorator_uses_given_name():
    reg = Registry("widget")

    @reg.register("thing")
    class Thing:
        pass

    assert reg.get("thing") is Thing
    assert "thing" in reg and len(reg) == 1 and reg.names() == ["thing"]


def test_lazy_entry_imports_on_first_get_only():
    reg = Registry("widget")
    reg.add_lazy("dumps", "json:dumps")
    import json
    assert reg.get("dumps") is json.dumps


def test_builtin_names_resolve_to_objects_registered_under_same_name():
    for registry, table in BUILTINS.items():
        for name in table:
            obj = registry.get(name)
            assert obj is not None
            assert registry.get(name) is obj  # resolved once, then stable


def test_listing_builtins_imports_no_component_module():
    code = ("import sys, hotloop; from hotloop.registry import ALL_REGISTRIES;"
            "[r.names() for r in ALL_REGISTRIES.values()];"
            "heavy=[m for m in sys.modules if m.startswith(('hotloop.models.', 'hotloop.problems.'))"
            " and not m.endswith('.base')]; print(heavy)")
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_user_module_from_path_registers_components(tmp_path):
    module = tmp_path / "my_components_for_test.py"
    module.write_text(
        "from hotloop.registry import models\n"
        "@models.register('my_test_model')\n"
        "class MyModel:\n    pass\n")
    try:
        import_user_module(str(module))
        assert models.get("my_test_model").__name__ == "MyModel"
        import_user_module(str(module))  # importing twice is harmless
    finally:
        models.unregister("my_test_model")
        sys.modules.pop("my_components_for_test", None)


def test_import_user_module_missing_file_is_clear(tmp_path):
    with pytest.raises(ImportError, match="not found"):
        import_user_module(str(tmp_path / "nope.py"))


def test_package_exports_registry_module():
    import importlib
    assert hotloop.registry.models is models
    importlib.import_module("hotloop.models")  # the subpackage must not shadow the registry
    assert hotloop.registry.models is models


def test_add_records_the_registered_name_on_classes_and_functions():
    reg = Registry("widget")

    @reg.register("first_name")
    class Thing:
        pass

    @reg.register("a_set")
    def make_set():
        return 1

    class Unregistered(Thing):
        pass

    reg.add("alias", Thing)                      # an alias keeps the first name
    reg.add("builtin_len", len)                  # builtins cannot carry the name: no error
    assert (Thing.registered_name, make_set.registered_name) == ("first_name", "a_set")
    assert registered_name(Thing) == "first_name" and registered_name(make_set) == "a_set"
    assert registered_name(Unregistered) is None  # inherited, not its own
    assert registered_name(len) is None
    reg.unregister("first_name")
    assert registered_name(Thing) is None
    reg.add("second_name", Thing)
    assert Thing.registered_name == "second_name"


def test_lazy_builtins_record_their_table_name():
    for registry, table in BUILTINS.items():
        for name in table:
            assert registered_name(registry.get(name)) == name, (registry.kind, name)


def test_problem_name_is_the_registered_name(tmp_path):
    for name in BUILTINS[problems]:
        problem = problems.get(name)(data_dir=tmp_path / "data", raw_dir=tmp_path / "raw")
        assert problem.name == name

    class MyCopy(problems.get("algorithmic_copy")):
        pass

    assert MyCopy().name == "MyCopy"            # an unregistered subclass is not the parent
    problems.add("my_copy_for_test", MyCopy)
    try:
        assert MyCopy().name == "my_copy_for_test"
    finally:
        problems.unregister("my_copy_for_test")
    assert MyCopy().name == "MyCopy"

"""The user pages are true: every `distrl train|eval` command they show composes, the configuration
page names every key `distrl train --help` and `distrl eval --help` print, and they speak of the
product, not of the project's history."""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import REPO
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from distrl.config.schema import config_dir, register_configs

USER_PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md"))]
PLACEHOLDERS = {"<run>": "run", "<Task>": "Hopper", "<Game>": "Pong", "PATH": "x", "seed=S": "seed=1"}


def shown_commands() -> list[tuple[str, list[str]]]:
    """``(page, argv)`` of every ``distrl train|eval`` command in a code block or inline code of a user
    page, each command once (the first page that shows it)."""
    found: dict[tuple[str, ...], str] = {}
    for page in USER_PAGES:
        text = page.read_text()
        for line in re.findall(r"(?:^|`|\$ )(distrl (?:train|eval)\b[^`#\n]*)", text, flags=re.MULTILINE):
            argv = (line.split()[1], *shlex.split(line.replace("\\", ""))[2:])
            found.setdefault(argv, page.name)
    return [(page, list(argv)) for argv, page in found.items()]


def test_the_user_pages_show_commands():
    assert len(shown_commands()) >= 20


@pytest.fixture(scope="module")
def compose():
    """Hydra's compose of distrl's configs, initialised once for the module (as compose_config
    composes, without its validation)."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        yield lambda overrides, config_name="train": hydra_compose(config_name, overrides=overrides)
    GlobalHydra.instance().clear()


@pytest.mark.parametrize(("page", "argv"), shown_commands(), ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_every_command_on_a_user_page_composes(page, argv, compose):
    from hydra._internal.utils import get_args_parser

    command, args = argv[0], [a for a in argv[1:] if a != "..."]
    overrides = []
    for arg in get_args_parser().parse_args(args).overrides:  # as Hydra reads the line: flags and their values apart
        if arg.lstrip("+").startswith("hydra"):
            continue
        for placeholder, value in PLACEHOLDERS.items():
            arg = arg.replace(placeholder, value)
        key, _, value = arg.partition("=")
        overrides.append(f"{key}={value.split(',')[0]}")  # a sweep: its first value
    compose(overrides, config_name=command)


def leaf_keys(cfg, prefix="") -> list[str]:
    keys = []
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        keys += leaf_keys(value, f"{name}.") if isinstance(value, dict) else [name]
    return keys


# the configs whose keys --help prints: the defaults and every option that brings keys of its own
VARIANTS = {"train": [[], ["env=gym"], ["experiment=mujoco"], ["intrinsic=e3b"], ["logger=wandb"]], "eval": [[]]}


def documented(text: str) -> set[str]:
    """The keys the configuration page names in inline code, ``{a,b}`` expanded."""
    names = set()
    for span in re.findall(r"`([^`]+)`", text):
        for part in re.split(r"\s*/\s*|\s+", span):
            braces = re.match(r"^(.*)\{([^}]*)\}(.*)$", part)
            names.update(f"{braces.group(1)}{x}{braces.group(3)}" for x in braces.group(2).split(",")) if braces \
                else names.add(part)
    return names


@pytest.mark.parametrize("command", ["train", "eval"])
def test_the_configuration_page_names_every_key_help_prints(command, compose):
    names = documented((REPO / "docs" / "configuration.md").read_text())
    keys = {key for overrides in VARIANTS[command]
            for key in leaf_keys(OmegaConf.to_container(compose(overrides, config_name=command)))}
    missing = sorted(key for key in keys
                     if key not in names and not any(key.startswith(n[:-1]) for n in names if n.endswith(".*")))
    assert not missing


# words of the project's own history (its issues, sessions and the libraries it was specified from), and
# of descriptions that are no longer true
HISTORY = (r"\bissue \d+", r"\bthe seeds\b", r"\bthe seeds'", r"\bthe seed's\b", r"Distributed IMPALA",
           r"\bsessions?\b", r"CPU torch")


def test_user_pages_speak_of_the_product_not_of_the_projects_history():
    for page in USER_PAGES:
        text = page.read_text()
        for word in HISTORY:
            assert not re.search(word, text, flags=re.IGNORECASE), f"{page.name}: {word}"

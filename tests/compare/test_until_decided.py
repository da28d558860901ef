"""Issue 42: seeds until decided. ``compare.until=decided`` runs seeds in rounds and adds seeds only to the runs that
undecided claims read, stopping when every claim is decided or ``max_seeds`` is reached; the report gives each
claim's look, and what the seeds it still needs would cost; a resumed comparison replays the same looks."""
import json

import pytest

import vlkit.compare.records as records_module
from vlkit.cli import compose, main
from vlkit.compare import Comparison, look_sizes_of, next_look, replay_looks, resolve_config
from vlkit.compare.command import write_plan

RUNS = ("[{name: a, model: {name: meter, preset: tiny}, objectives: meter}, "
        "{name: b, model: {name: meter, preset: tiny}, objectives: meter, baseline: false}, "
        "{name: c, model: {name: meter, preset: tiny, fusion: merged}, objectives: meter, baseline: false}, "
        "{name: d, model: {name: meter, preset: tiny}, objectives: meter, baseline: false}]")
CLAIMS = ("[{claim: a beats b, a: a, b: b, metric: vqa, expect: higher, paper_effect: 1.0}, "
          "{claim: c beats d, a: c, b: d, metric: vqa, expect: higher}]")
SETTINGS = ["compare=smoke", "compare.seeds=[0,1,2]", f"compare.runs={RUNS}", f"+compare.claims={CLAIMS}",
            "compare.until=decided", "compare.max_seeds=5", "compare.round_seeds=1"]


def comparison(extra=()):
    return Comparison(resolve_config(compose("compare", [*SETTINGS, *extra])), ".", progress=False)


def fake_records(values):
    """Records of runs a-d whose vqa per seed is ``values[run][seed]``."""
    return [{"run": run, "variant": "pretrained", "seed": seed, "vqa": v}
            for run, per_seed in values.items() for seed, v in enumerate(per_seed)]


def test_seeds_are_added_only_to_the_runs_of_undecided_claims(monkeypatch):
    """Claim 1's differences are large and steady: decided at the first look, its runs keep 3 seeds; claim 2's are
    noise: its runs get a 4th seed, then a 5th, and the looks end at max_seeds."""
    comp = comparison()
    decided = {"a": [0.9, 0.91, 0.89, 0.9, 0.9], "b": [0.1, 0.1, 0.1, 0.1, 0.1]}
    noise = {"c": [0.5, 0.52, 0.47, 0.51, 0.49], "d": [0.5, 0.49, 0.52, 0.5, 0.48]}

    def finished(c):  # the first n seeds of each run have results
        return [r for r in fake_records({**decided, **noise}) if r["seed"] < len(c.seeds_of(
            [s.name for s in c.specs].index(r["run"])))]

    monkeypatch.setattr(records_module, "finished_records", finished)
    assert next_look(comp)
    assert [len(comp.seeds_of(i)) for i in range(4)] == [3, 3, 4, 4]
    assert comp.all_seeds() == [0, 1, 2, 3]
    keys = {comp.key(u) for u in comp.all_units()}
    assert "c/seed3/pretrain" in keys and "a/seed3/pretrain" not in keys
    assert comp.unit_of("d/seed3/pretrained-vqa").seed == 3
    with pytest.raises(KeyError, match="not a unit"):
        comp.unit_of("d/seed9/pretrain")  # beyond max_seeds
    assert next_look(comp) and [len(comp.seeds_of(i)) for i in range(4)] == [3, 3, 5, 5]
    assert not next_look(comp)  # the last look: every claim decided or inconclusive
    fresh = comparison()
    replay_looks(fresh)  # a comparison read back from its folder reaches the same look
    assert fresh.run_seeds == comp.run_seeds


def test_a_look_waits_for_every_result_of_the_current_one(monkeypatch):
    comp = comparison()
    monkeypatch.setattr(records_module, "finished_records",
                        lambda c: fake_records({"a": [0.9, 0.9], "b": [0.1, 0.2], "c": [0.5] * 3, "d": [0.4] * 3}))
    assert not next_look(comp) and comp.run_seeds == {}


def test_until_keys_are_checked_before_any_work(tmp_path):
    for extra, message in ((["compare.until=forever"], "compare.until='forever'"),
                           (["compare.max_seeds=2"], "below the 3 compare.seeds"),
                           (["compare.round_seeds=0"], "compare.round_seeds=0"),
                           (["compare.max_seeds=null"], "compare.max_seeds=None")):
        with pytest.raises(ValueError, match=message):
            look_sizes_of(comparison(extra).compare)
    with pytest.raises(ValueError, match="compare.until='forever'"):
        main(["compare", *SETTINGS, "compare.until=forever", f"output_dir={tmp_path / 'out'}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_comparison_until_decided_runs_rounds_and_reports_each_claims_look(tmp_path):
    """The real thing at smoke size: no claim can be decided on 3 steps of training, so the runs of both claims
    get seeds 3 and 4; the report states each claim's look and what 80% power would take; a rerun with
    resume=true replays the looks and runs nothing."""
    out = tmp_path / "out"
    common = [*SETTINGS, "compare.tasks=[vqa]", "data.num_images=16", "data.val_images=8", "compare.itm_pairs=8",
              "compare.zero_shot=false", "workers=2", "threads=1", "progress=false", f"cache_dir={tmp_path / 'cache'}",
              f"output_dir={out}"]
    assert main(["compare", *common]) == 0
    result = json.loads((out / "results.json").read_text())
    seeds = {(r["run"], r["variant"]): sorted({x["seed"] for x in result["records"] if x["run"] == r["run"]
                                               and x["variant"] == r["variant"]}) for r in result["records"]}
    assert seeds[("a", "pretrained")] == [0, 1, 2, 3, 4] and seeds[("d", "pretrained")] == [0, 1, 2, 3, 4]
    assert result["looks"] == [3, 4, 5]
    assert [c["verdict"] for c in result["claims"]] == ["inconclusive"] * 2  # a and b are the same run: no spread
    assert all(c["rule"]["look"] >= 1 for c in result["claims"])
    need = result["seeds_needed"]
    assert need[0]["paper_effect"] == pytest.approx(0.01) and need[0]["hours_per_seed"] > 0
    assert result["plan"]["device"] == "cpu"
    text = (out / "results.md").read_text()
    assert "group-sequential rule at looks after [3, 4, 5] seeds" in text and "### Seeds a claim needs" in text
    before = sorted(p.stat().st_mtime_ns for p in out.glob("runs/*/*/*/unit.json"))
    assert main(["compare", *common, "resume=true"]) == 0
    assert sorted(p.stat().st_mtime_ns for p in out.glob("runs/*/*/*/unit.json")) == before


CHANGED_CLAIMS = CLAIMS.replace("{claim: c beats d, a: c, b: d, metric: vqa, expect: higher}",
                                "{claim: c beats d, a: c, b: d, metric: vqa, expect: lower}")


@pytest.mark.parametrize("override, named", [
    (f"+compare.claims={CHANGED_CLAIMS}", "compare.claims['c beats d'].expect: 'higher' -> 'lower'"),
    (f"+compare.claims={CLAIMS[:CLAIMS.index(', {claim: c')]}]", "claim 'c beats d' dropped"),
    ("compare.alpha=0.1", "compare.alpha: 0.05 -> 0.1"),
    ("compare.until=fixed", "compare.until: 'decided' -> 'fixed'"),
    ("compare.max_seeds=4", "compare.max_seeds: 5 -> 4"),
    ("compare.max_seeds=9", "compare.max_seeds: 5 -> 9"),
    ("compare.round_seeds=2", "compare.round_seeds: 1 -> 2"),
    ("compare.max_device_hours=2.5", "compare.max_device_hours: None -> 2.5")])
def test_a_resume_that_changes_the_preregistered_analysis_is_refused(tmp_path, override, named):
    """The claims (each with its direction and kind), alpha, until, max_seeds, the round size, the looks and the budget
    are frozen in plan.json at the first session: a resume that changes any is refused naming it, before any write."""
    write_plan(resolve_config(compose("compare", SETTINGS)), tmp_path, [], resume=False)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["preregistered"]["looks"] == [3, 4, 5] and plan["preregistered"]["alpha"] == 0.05
    assert [c["expect"] for c in plan["preregistered"]["claims"]] == ["higher", "higher"]
    settings = [x for x in SETTINGS if not x.startswith(override.split("=")[0])] + [override]
    with pytest.raises(ValueError, match="pre-registered") as err:
        write_plan(resolve_config(compose("compare", settings)), tmp_path, [], resume=True)
    assert named in str(err.value) and "new output_dir" in str(err.value)
    assert json.loads((tmp_path / "plan.json").read_text()) == plan


def test_a_resume_that_changes_a_safe_key_records_it_in_the_plan(tmp_path):
    """Where and how units run may change on resume: the plan then holds the new value and the resuming command."""
    write_plan(resolve_config(compose("compare", SETTINGS)), tmp_path, ["compare=smoke"], resume=False)
    write_plan(resolve_config(compose("compare", [*SETTINGS, "compare.retries=2"])), tmp_path, ["compare.retries=2"],
               resume=True)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["config"]["compare"]["retries"] == 2 and plan["argv"] == ["compare.retries=2"]
    described = [x for x in SETTINGS if not x.startswith("+compare.claims")] + [
        "+compare.claims=" + CLAIMS.replace("paper_effect: 1.0", "paper_effect: 2.0, paper: Table 1, planning_sd: 1.0")]
    write_plan(resolve_config(compose("compare", described)), tmp_path, [], resume=True)  # describes, tests nothing
    changed = resolve_config(compose("compare", [*SETTINGS, "compare.budget.pretrain_steps=5"]))
    with pytest.raises(ValueError, match="compare.budget.pretrain_steps"):
        write_plan(changed, tmp_path, [], resume=True)


def test_a_look_starts_only_within_the_budget(monkeypatch):
    """compare.max_device_hours: spent so far (6 h) + the next look's seeds (c and d one seed each at 1 h per seed,
    times 1.5: the finished units spent 1.5x their plan) = 9 h; a budget of 8.9 stops the looks, 9 lets one start."""
    import vlkit.compare.looks as looks

    noise = {"a": [0.9] * 3, "b": [0.1, 0.11, 0.09], "c": [0.5, 0.52, 0.47], "d": [0.5, 0.49, 0.52]}
    monkeypatch.setattr(records_module, "finished_records", lambda c: fake_records(noise))
    monkeypatch.setattr(records_module, "finished_results", lambda c: {})
    monkeypatch.setattr(looks, "spent_costs", lambda c, results: None)
    units = {"u1": {"state": "finished", "planned_hours": 2.0, "device_hours": 3.0},
             "u2": {"state": "finished", "planned_hours": 2.0, "device_hours": 3.0},
             "u3": {"state": "died", "planned_hours": 1.0, "device_hours": 0.5}}
    monkeypatch.setattr(looks, "account", lambda c, plan: {"device_hours": 6.0, "units": units})
    monkeypatch.setattr(looks, "seed_costs", lambda c, plan: {"seed_hours": {"a": 5.0, "b": 5.0, "c": 1.0, "d": 1.0}})
    stopped = comparison(["compare.max_device_hours=8.9"])
    assert not next_look(stopped) and stopped.run_seeds == {}
    started = comparison(["compare.max_device_hours=9"])
    assert next_look(started) and [len(started.seeds_of(i)) for i in range(4)] == [3, 3, 4, 4]
    with pytest.raises(ValueError, match="compare.max_device_hours=-1"):
        from vlkit.compare.preregistration import preregistration
        preregistration(comparison(["compare.max_device_hours=-1"]).compare)


def test_results_name_the_claims_the_budget_left_undecided_and_their_price():
    from vlkit.compare.report import budget_section

    claims = [{"claim": "c beats d", "a": "c", "b": "d", "verdict": "running"},
              {"claim": "a beats b", "a": "a", "b": "b", "verdict": "reproduced"}]
    records = fake_records({"a": [0.9] * 3, "b": [0.1] * 3, "c": [0.5] * 4, "d": [0.5] * 4})
    account = {"device_hours": 8.5, "units": {"u": {"state": "finished", "planned_hours": 2.0, "device_hours": 3.0}}}
    compare = {"max_device_hours": 9.0, "max_seeds": 6}
    text = "\n".join(budget_section(compare, claims, records, account, {"device": "cpu", "seed_hours":
                                                                          {"c": 1.0, "d": 0.5}}))
    # c and d from 4 to 6 seeds: 2 x (1.0 + 0.5) x 1.5 = 4.5 cpu-hours
    assert "left 1 claim(s) undecided: c beats d" in text and "up to 4.5 more cpu-hours" in text
    assert budget_section({"max_device_hours": None}, claims, records, account, None) == []


def test_the_dry_run_prices_every_look():
    """A dry run of compare.until=decided prices each look up to max_seeds (the most: every claim undecided), and the
    expected cost at the paper effects: claim 1's huge effect is decided within the first looks, so mostly claim 2's
    runs (no paper effect: undecided to the end) add seeds."""
    import re

    import vlkit.compare.looks as looks

    costs = {"device": "a100", "seed_hours": {"a": 1.0, "b": 1.0, "c": 2.0, "d": 3.0}}
    claims = ("[{claim: a beats b, a: a, b: b, metric: vqa, expect: higher, paper_effect: 30.0, planning_sd: 1.0}, "
              "{claim: c beats d, a: c, b: d, metric: vqa, expect: higher}]")
    comp = comparison([f"+compare.claims={claims}", "compare.max_seeds=9", "compare.max_device_hours=40"])
    text = "\n".join(looks.looks_plan(comp, 10.0, costs))
    assert "| 7 | 9 | 52.0 | 100% |" in text and "| 1 | 3 | 10.0 | 100% |" in text  # 10 + 6 x (1 + 1 + 2 + 3)
    assert "At most: 52.0 a100-hours" in text
    expected = float(re.search(r"Expected at the paper effects: ([0-9.]+) a100-hours", text).group(1))
    assert 40.0 <= expected < 42.0  # 10 + 6 x (2 + 3) for c and d, a and b decided after 3 or 4 seeds
    assert "check a decision from 6 seeds on" in text and "looks up to 7 seeds fit" in text  # 10 + 4 x 7 = 38
    assert looks.looks_plan(comparison(["compare.until=fixed"]), 1.0, costs) == []

"""Save and restore across executors (issue 39, point 2): a state saved with Ray actors restores
with local workers and the reverse, with another number of actors, exactly where it was saved;
``energon checkpoint info`` and the ledger read these states as any other."""

from __future__ import annotations

import json

from click.testing import CliRunner

from energon import Ledger
from energon.cli.main import main as cli
from tests.ray.helpers import dataset, keys, local_loader, ray_loader


def test_ray_to_local_and_local_to_more_actors(ray_cluster, text_ds, tmp_path):
    expected = keys(local_loader(text_ds, 2), 40)
    # Ray (2 actors) -> local (2 workers)
    run = ray_loader(ray_cluster, text_ds, 2)
    it = iter(run)
    assert keys(it, 7) == expected[:7]
    state = json.loads(json.dumps(run.save_state_rank()))
    restored = local_loader(text_ds, 2)
    restored.restore_state_rank(state)
    assert keys(restored, 10) == expected[7:17]
    run.close()  # its 2 actors wait for the next loader (keep_actors)
    # local (1 worker) -> Ray (3 actors over the 2 streams)
    local = local_loader(text_ds, 1, streams=2)
    assert keys(local, 13) == expected[:13]
    state = json.loads(json.dumps(local.save_state_rank()))
    more = ray_loader(ray_cluster, text_ds, 3)
    more.restore_state_rank(state)
    assert keys(more, 12) == expected[13:25]
    # the tools read a state saved by actors as any other
    saved = more.save_state_rank()
    path = tmp_path / "state.json"
    path.write_text(json.dumps([saved]))
    info = CliRunner().invoke(cli, ["checkpoint", "info", str(path)])
    assert info.exit_code == 0, info.output
    assert "rank 0: consumed 25 micro-batches" in info.output
    records = Ledger(dataset(text_ds, 2), states=[saved]).describe_positions(range(25))
    assert [[s.key for s in r.samples] for r in records] == [k for _, k in expected[:25]]

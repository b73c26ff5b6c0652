"""asr.bench.memory: activation bytes counted on the CPU, and the audio a GPU's memory holds from them."""

from asr.bench import memory


def test_recomputing_blocks_saves_activations_and_sharding_saves_state():
    row = memory.estimate("conformer-tiny", 3.0)
    assert row["plain"] > 3 * row["checkpointed"] > 0  # activations per audio-second, bytes
    assert row["parameters"] > row["blocks"] * row["block"] * 0.5
    ddp, ddp_recomputed, fsdp, fsdp_recomputed = (memory.batch_seconds(row, 80, 8, sharded, recomputed)
                                                  for sharded in (False, True) for recomputed in (False, True))
    assert ddp_recomputed > ddp > 0 and fsdp > ddp and fsdp_recomputed > fsdp


def test_a_model_whose_state_fills_the_gpu_holds_no_audio():
    row = {"parameters": 10e9, "block": 1e8, "plain": 1e6, "checkpointed": 1e5}  # 10B parameters: 160 GB of state
    assert memory.batch_seconds(row, 80, 1, False, False) == 0.0
    assert memory.batch_seconds(row, 80, 8, True, True) > 0  # 20 GB each over 8 GPUs

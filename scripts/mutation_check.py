"""Prove that the control-logic tests can fail: break the driver, the gate, the engine, the
sampler, the server's worker, the chat template's keyword arguments, the agents' parts (the
answer splitter, the constrained step, tool calls in templates and answers), the server's chat
page (its test runs in headless Chromium: without it, that mutation survives) and Responses
store, the experts' routing and shared expert, gpt-oss's sinks, clamped GLU and MXFP4 decoding,
and the resolution of models named on the hub on
purpose, one named
mutation at a time, and require the tests that name the behaviour to fail.

Each mutation is applied to a copy of the package in a temporary folder (the working tree is
never touched), the named tests run there against the copy, and the check fails if any named
test still passes (the mutation survived) or if a mutation no longer applies (its text moved).
Exit status: 0 when every mutation is killed.

    python scripts/mutation_check.py
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation(
        "the driver does not advance the grammar past the tokens it takes",
        "arcpy/loop/burst.py",
        "                    self.guide.advance(tok)\n",
        "                    pass\n",
        ("tests/test_mask_loop.py::test_the_loop_applies_the_mask_on_the_device_and_makes_the_host_paths_tokens"
         "[greedy]",),
    ),
    Mutation(
        "an ended sequence does not release the masked steps in flight",
        "arcpy/loop/engine.py",
        "            self.driver.release()  # a masked burst's steps still in flight must not wait for masks\n",
        "            pass\n",
        ("tests/test_mask_loop.py::test_a_stop_string_mid_burst_lets_the_steps_in_flight_pass",),
    ),
    Mutation(
        "drop the fault-word read",
        "arcpy/loop/burst.py",
        "            if state.fault:\n",
        "            if False:\n",
        ("tests/test_burst.py::test_fault_word_raises_naming_token_and_position",
         "tests/test_burst.py::test_fault_word_is_read_even_when_the_stream_never_goes_idle",
         "tests/test_engine_control.py::test_fault_word_falls_back_to_host_path_and_latches_off"),
    ),
    Mutation(
        "skip one launch per burst",
        "arcpy/loop/burst.py",
        "        for k in range(steps):\n",
        "        for k in range(steps - 1):\n",
        ("tests/test_burst.py::test_burst_yields_the_scripted_tokens_in_order",
         "tests/test_burst.py::test_burst_enqueues_every_step_before_the_first_token_is_read",
         "tests/test_engine_control.py::test_burst_is_clipped_to_the_remaining_budget"),
    ),
    Mutation(
        "the first burst after a prefill replays the step graph instead of committing its logits",
        "arcpy/loop/burst.py",
        "            if k == 0 and first_commit:\n",
        "            if False:\n",
        ("tests/test_engine_control.py::test_the_prompt_goes_through_one_prefill_and_its_logits_give_the_first_token[True]",
         "tests/test_engine_control.py::test_device_loop_makes_zero_host_waits_per_token[True]"),
    ),
    Mutation(
        "the host path runs the last prompt token's forward again after the prefill",
        "arcpy/loop/host.py",
        "        if seq.prefilled:\n            seq.prefilled = False  # the prefill left this step's logits\n",
        "        if False:\n            pass\n",
        ("tests/test_engine_control.py::test_the_prompt_goes_through_one_prefill_and_its_logits_give_the_first_token[False]",),
    ),
    Mutation(
        "ignore stream-query errors",
        "arcpy/loop/burst.py",
        "                except DeviceFaultError:\n"
        "                    yield from self._take(self._ready(self.device.poll_ring()))\n"
        "                    raise\n",
        "                except DeviceFaultError:\n"
        "                    idle_seen = False\n",
        ("tests/test_burst.py::test_sticky_fault_surfaces_through_stream_query",
         "tests/test_engine_control.py::test_sticky_fault_poisons_the_engine_and_refuses_further_work"),
    ),
    Mutation(
        "ignore idle-but-short",
        "arcpy/loop/burst.py",
        "            if idle_seen:\n",
        "            if False:\n",
        ("tests/test_burst.py::test_lost_launch_is_detected_as_idle_but_short",
         "tests/test_engine_control.py::test_short_burst_falls_back_with_identical_tokens"),
    ),
    Mutation(
        "do not clear parked tokens on completion",
        "arcpy/loop/engine.py",
        "        self.parked.clear()\n        self.pending_logprobs.clear()\n        if seq is None or seq.finished:\n",
        "        self.pending_logprobs.clear()\n        if seq is None or seq.finished:\n",
        ("tests/test_engine_control.py::test_parked_tokens_cleared_on_completion_no_stale_token_in_next_sequence",
         "tests/test_engine_control.py::test_parked_tokens_cleared_on_preemption"),
    ),
    Mutation(
        "do not clear parked tokens on fallback",
        "arcpy/loop/engine.py",
        "            self.seq.constrained.rollback(len(self.parked))\n        self.parked.clear()\n",
        "            self.seq.constrained.rollback(len(self.parked))\n",
        ("tests/test_engine_control.py::test_parked_tokens_cleared_on_fallback",),
    ),
    Mutation(
        "admit non-greedy sampling on a device loop without a sampler",
        "arcpy/devices/protocol.py",
        "        if not spec.sampling.is_greedy() and not self.sampling:\n",
        "        if False:\n",
        ("tests/test_gate.py::test_sampling_is_admitted_where_the_device_loop_draws_and_refused_by_name_elsewhere",
         "tests/test_engine_control.py::test_sampling_takes_the_host_path_where_the_device_loop_has_no_sampler"),
    ),
    Mutation(
        "unset ARC_GRAPH_DEVICE_LOOP means off",
        "arcpy/loop/gate.py",
        "DEFAULTS = {DEVICE_LOOP: True,",
        "DEFAULTS = {DEVICE_LOOP: False,",
        ("tests/test_gate.py::test_device_loop_is_on_when_unset_where_the_backend_has_one",
         "tests/test_engine_control.py::test_the_device_loop_is_the_default_and_the_environment_can_pin_it_off"),
    ),
    Mutation(
        "the host path draws for the forward's position, not the token's",
        "arcpy/loop/host.py",
        "self.seq.sampler.sample(valid, self.seq.position + 1)",
        "self.seq.sampler.sample(valid, self.seq.position)",
        ("tests/test_engine_control.py::test_a_seeded_sampled_sequence_draws_the_same_tokens_on_the_device_loop"
         "_and_the_host_path[3]",),
    ),
    Mutation(
        "the host path draws from the padded logits too",
        "arcpy/loop/host.py",
        "        valid = logits[:self.device.vocab]\n",
        "        valid = logits\n",
        ("tests/test_engine_control.py::test_the_host_path_draws_from_the_valid_ids_only",),
    ),
    Mutation(
        "a fallback draws with another seed",
        "arcpy/loop/engine.py",
        "        self.seq.loop = False\n",
        "        self.seq.loop = False\n"
        "        p = self.seq.sampler.params\n"
        "        self.seq.sampler = Sampler(Sampling(p.temperature, p.top_k, p.top_p, p.seed + 1))\n",
        ("tests/test_engine_control.py::test_a_fallback_in_the_middle_of_a_sampled_sequence_keeps_drawing_the_same"
         "_tokens[fault-word]",
         "tests/test_engine_control.py::test_a_fallback_in_the_middle_of_a_sampled_sequence_keeps_drawing_the_same"
         "_tokens[lost-step]"),
    ),
    Mutation(
        "the driver does not give the device its sampling parameters",
        "arcpy/loop/burst.py",
        "        if spin_until(lambda: self.device.begin_sequence(start),",
        "        if spin_until(lambda: self.device.begin_sequence(type(start)(**{**vars(start), 'sampling': None})),",
        ("tests/test_burst.py::test_begin_sequence_gives_the_device_its_sampling_parameters",
         "tests/test_engine_control.py::test_a_seeded_sampled_sequence_draws_the_same_tokens_on_the_device_loop"
         "_and_the_host_path[16]"),
    ),
    Mutation(
        "Philox with nine rounds",
        "arcpy/sampling.py",
        "    for r in range(10):\n",
        "    for r in range(9):\n",
        ("tests/test_sampling.py::test_philox_known_answers[zeros]",
         "tests/test_sampling.py::test_philox_known_answers[pi-digits]"),
    ),
    Mutation(
        "top-p keeps one candidate past the shortest prefix",
        "arcpy/sampling.py",
        "        j = _first_above(w, need - 1)\n",
        "        j = _first_above(w, need)\n",
        ("tests/test_sampling.py::test_the_sampler_draws_what_the_literal_definition_draws",),
    ),
    Mutation(
        "ties at a cut go to the higher ids",
        "arcpy/sampling.py",
        "np.flatnonzero(np.equal(l, edge, out=mask))[:ties]",
        "np.flatnonzero(np.equal(l, edge, out=mask))[::-1][:ties]",
        ("tests/test_sampling.py::test_the_fast_paths_of_a_large_vocabulary_draw_what_the_literal_definition_draws",
         "tests/test_sampling.py::test_top_k_and_top_p_keep_only_the_leading_candidates"),
    ),
    Mutation(
        "the partial sort is trusted when its weights fall short of top-p",
        "arcpy/sampling.py",
        "            if int(_block_sums(w)[-1]) >= need:\n",
        "            if True:\n",
        ("tests/test_sampling.py::test_the_fast_paths_of_a_large_vocabulary_draw_what_the_literal_definition_draws",),
    ),
    Mutation(
        "the draw ignores the position",
        "arcpy/sampling.py",
        "        x = int(draw_words(self.params.seed, position))\n",
        "        x = int(draw_words(self.params.seed, 0))\n",
        ("tests/test_sampling.py::test_the_sampler_draws_what_the_literal_definition_draws",
         "tests/test_sampling.py::test_sampling_follows_the_distribution"),
    ),
    Mutation(
        "raise the fault word before the tokens the same poll shows",
        "arcpy/loop/burst.py",
        "            if ready > self.published:\n"
        "                yield from self._take(ready)\n"
        "                spins = 0\n"
        "                if not speculative:\n"
        "                    continue\n",
        "            if state.fault:\n"
        "                raise fault_error(state)\n"
        "            if ready > self.published:\n"
        "                yield from self._take(ready)\n"
        "                spins = 0\n"
        "                if not speculative:\n"
        "                    continue\n",
        ("tests/test_burst.py::test_tokens_visible_in_the_same_poll_as_the_fault_word_are_yielded_first",
         "tests/test_burst.py::test_bad_logits_raise_after_the_tokens_before_them_without_falling_back[non-finite]"),
    ),
    Mutation(
        "drop the tokens that landed before a sticky fault",
        "arcpy/loop/burst.py",
        "                except DeviceFaultError:\n"
        "                    yield from self._take(self._ready(self.device.poll_ring()))\n",
        "                except DeviceFaultError:\n",
        ("tests/test_burst.py::test_tokens_that_land_before_a_sticky_fault_are_yielded_before_it",),
    ),
    Mutation(
        "a speculative burst gives the device no token limit",
        "arcpy/loop/burst.py",
        "        self.device.begin_burst(self.burst_id, max_tokens)\n",
        "        self.device.begin_burst(self.burst_id, None)\n",
        ("tests/test_speculation.py::test_the_burst_limit_stops_publication_mid_step",),
    ),
    Mutation(
        "a speculative burst ends one step before its last step ran",
        "arcpy/loop/burst.py",
        "            if self.published >= want or state.steps - base_steps >= steps:\n",
        "            if self.published >= want or state.steps - base_steps >= steps - 1:\n",
        ("tests/test_speculation.py::test_speculative_burst_yields_the_models_tokens_and_more_than_one_a_step",),
    ),
    Mutation(
        "the estimate of what drafts make ignores the drafts that matched",
        "arcpy/drafting.py",
        "        made = self._matched + 1\n",
        "        made = 1\n",
        ("tests/test_speculation.py::test_acceptance_counts_what_each_step_would_make",
         "tests/test_speculation.py::test_policy_starts_plain_speculates_once_drafts_would_pay_and_sizes_bursts_by_them"),
    ),
    Mutation(
        "the engine remembers no answer for the drafts of later sequences",
        "arcpy/loop/engine.py",
        "            self.memory.remember(seq.policy.prompt, seq.policy.answer)\n",
        "            pass\n",
        ("tests/test_draft_memory.py::test_a_question_asked_again_speculates_on_its_remembered_answer_with_the_same_tokens",),
    ),
    Mutation(
        "the device is never sent the drafts' memory",
        "arcpy/loop/plan.py",
        "            draft_memory=None if memory is None else tuple(memory),\n",
        "            draft_memory=None if memory is None else (),\n",
        ("tests/test_draft_memory.py::test_a_question_asked_again_speculates_on_its_remembered_answer_with_the_same_tokens",),
    ),
    Mutation(
        "drafts from the memory run past the end of a remembered sequence",
        "arcpy/drafting.py",
        "        if tok < 0:\n            break\n",
        "",
        ("tests/test_draft_memory.py::test_a_question_asked_again_drafts_its_earlier_answer",
         "tests/test_draft_memory.py::test_acceptance_counts_steps_whose_drafts_run_out_at_a_separator"),
    ),
    Mutation(
        "a fault word on a rank other than 0 goes unseen",
        "arcpy/parallel/devices.py",
        "            if faulted is not None:  # another rank's fault word: the burst's fault, as on rank 0\n",
        "            if False:\n",
        ("tests/test_tensor_parallel_loop.py::test_a_fault_word_on_any_rank_falls_back_with_the_same_tokens[1]",),
    ),
    Mutation(
        "a token counts once rank 0 has it, whatever the other ranks committed",
        "arcpy/parallel/devices.py",
        "        count = min(s.published for s in states)\n",
        "        count = states[0].published\n",
        ("tests/test_tensor_parallel_loop.py::test_a_commit_lost_on_rank_1_falls_back_with_the_same_tokens",),
    ),
    Mutation(
        "the ranks' tokens are not compared",
        "arcpy/parallel/devices.py",
        "                if theirs != tokens:\n",
        "                if False:\n",
        ("tests/test_tensor_parallel_loop.py::test_a_rank_that_commits_another_token_stops_the_loop_before_that_token",),
    ),
    Mutation(
        "only rank 0's stream is asked whether it faulted",
        "arcpy/parallel/devices.py",
        "        idle = [dev.stream_query() for dev in self.ranks]  # every rank, so that any rank's fault surfaces\n",
        "        idle = [self.ranks[0].stream_query()]\n",
        ("tests/test_tensor_parallel_loop.py::test_the_stream_query_asks_every_rank",),
    ),
    Mutation(
        "a sampled speculative step accepts its rows' argmaxes, not their draws",
        "arcpy/devices/fake.py",
        "            made = self._drawn(*self.script.forward(row_token, p + i), p + i)\n",
        "            made = self.script.forward(row_token, p + i)[1]\n",
        ("tests/test_speculation.py::test_a_sampled_request_with_its_own_seed_speculates_and_gives_the_plain_loops_tokens"
         "[t1-k3-p0.9-11]",),
    ),
    Mutation(
        "--no-speculate leaves speculation on",
        "arcpy/options.py",
        "            options[\"speculate\"] = 0\n",
        "            pass\n",
        ("tests/test_template_kwargs.py::test_speculation_is_on_unless_switched_off",),
    ),
    Mutation(
        "the server's worker never looks at a cancel",
        "arcpy/serve/worker.py",
        "                    if job.cancelled:\n                        break\n",
        "                    if False:\n                        break\n",
        ("tests/test_serve_worker.py::test_the_queue_is_bounded_a_cancelled_job_leaves_it_and_stop_ends_everything",
         "tests/test_serve_queue.py::test_a_client_that_leaves_cancels_its_sequence_and_the_next_request_starts[False]"),
    ),
    Mutation(
        "the hand-off to the event loop keeps only the last piece of a batch",
        "arcpy/serve/worker.py",
        "                    items, self._items = self._items, []\n",
        "                    items, self._items = self._items[-1:], []\n",
        ("tests/test_serve_worker.py::test_pieces_cross_from_a_thread_in_order_and_none_is_lost",),
    ),
    Mutation(
        "a qwen2 vocabulary's words are cut by GPT-2's expression",
        "arcpy/text/pretokenize.py",
        '    **_names(_QWEN2_PRE, "qwen2",',
        '    **_names(_GPT2_PRE, "qwen2",',
        ("tests/test_tokenizer_vectors.py::test_every_case_encodes_to_llama_cpps_ids[qwen2]",),
    ),
    Mutation(
        "a gemma4 vocabulary starts with BOS only where its file says so",
        "arcpy/text/pretokenize.py",
        "add_bos=True, bos_always=True, byte_level=False)",
        "add_bos=True, byte_level=False)",
        ("tests/test_gguf.py::test_a_gemma4_vocabulary_is_bpe_on_utf8_with_spaces_as_u2581_and_always_starts_with_bos",),
    ),
    Mutation(
        "the chat template never sees a request's keyword arguments",
        "arcpy/loop/prompt.py",
        "template_kwargs=request.template_kwargs,",
        "template_kwargs=None,",
        ("tests/test_template_kwargs.py::test_a_request_carries_them_to_the_prompt",
         "tests/test_template_kwargs.py::test_the_chat_command_renders_every_turn_with_them"),
    ),
    Mutation(
        "a template keyword argument may replace a name that arcpy sets",
        "arcpy/text/chat.py",
        "        if name in SET_BY_ARCPY:\n",
        "        if False:\n",
        ("tests/test_template_kwargs.py::test_a_name_arcpy_sets_or_the_sandbox_defines_cannot_be_given[messages]",),
    ),
    Mutation(
        "a template keyword argument's special-token strings become control tokens",
        "arcpy/text/chat.py",
        "    context.update({name: _marked(marks, value, keys=name != \"tools\") for name, value in kwargs.items()})\n",
        "    context.update(kwargs)\n",
        ("tests/test_template_kwargs.py::test_special_token_strings_in_an_argument_are_text",),
    ),
    Mutation(
        "the reference skips the q/k norms the layer program lists",
        "arcpy/devices/reference_ops.py",
        "OP_QK_NORM: self.qk_norm,",
        "OP_QK_NORM: lambda li, L: None,",
        ("tests/test_families.py::test_the_reference_runs_the_q_k_norms_the_program_lists",
         "tests/test_family_goldens.py::test_the_layer_program_computes_what_transformers_computes[qwen3]"),
    ),
    Mutation(
        "a windowed layer attends one position more than its window",
        "arcpy/model/config.py",
        "        return 0 if n > 0 and layer % n == n - 1 else self.sliding_window\n",
        "        return 0 if n > 0 and layer % n == n - 1 else self.sliding_window + 1\n",
        ("tests/test_family_goldens.py::test_the_layer_program_computes_what_transformers_computes[gemma3]",),
    ),
    Mutation(
        "take a token before its log-probabilities are written",
        "arcpy/loop/burst.py",
        "        return state.published if self.sink is None else min(state.published, state.logprobs)\n",
        "        return state.published\n",
        ("tests/test_logprobs.py::test_a_stop_id_whose_entry_lands_after_it_still_ends_the_burst_cleanly",),
    ),
    Mutation(
        "reuse a prefix past the device's granule",
        "arcpy/loop/prefix.py",
        "    return same // granule * granule\n",
        "    return same\n",
        ("tests/test_prefix_cache.py::test_the_reused_prefix_is_a_multiple_of_the_granule",),
    ),
    Mutation(
        "a stored prefix comes back at the stride of the positions restored",
        "arcpy/loop/prefix.py",
        "            device.load_prefix(entry.offset, best, len(entry.tokens))\n",
        "            device.load_prefix(entry.offset, best, best)\n",
        ("tests/test_prefix_cache.py::test_reference_a_stored_prefix_restored_in_part_gives_a_cold_runs_tokens",),
    ),
    Mutation(
        "the scored prompt's rows are forgotten",
        "arcpy/loop/host.py",
        "        self.prefix.rewritten(prompt, caps.prefix_granule, dev)\n",
        "        self.prefix.forget_held()\n",
        ("tests/test_logprobs.py::test_the_scored_prompt_is_held_at_any_position_and_a_device_without_a_prefill_refuses",),
    ),
    Mutation(
        "a recurrent model's prefill resumes without the state its prefix left",
        "arcpy/loop/prefix.py",
        "            device.load_state(0 if entry is None else entry.offset + best * self.row_bytes, best)\n",
        "            pass\n",
        ("tests/test_prefix_state.py::test_reference_alternating_conversations_of_a_hybrid_get_their_states_back_from_the_store",),
    ),
    Mutation(
        "the top k's weights renormalized where the config says not, and not where it says so",
        "arcpy/model/moe.py",
        "    if norm_topk_prob:\n",
        "    if not norm_topk_prob:\n",
        ("tests/test_moe_goldens.py::test_the_moe_layer_program_computes_what_transformers_computes[qwen3moe]",),
    ),
    Mutation(
        "gpt-oss's sinks leave the softmax's denominator",
        "arcpy/devices/reference_ops.py",
        "        total = total + np.exp(sink - top)\n",
        "        total = total + 0\n",
        ("tests/test_gpt_oss.py::test_with_a_float32_cache_the_reference_computes_what_transformers_computes",
         "tests/test_gpt_oss.py::test_sinks_join_the_softmax_denominator_alone"),
    ),
    Mutation(
        "gpt-oss's experts' GLU is not clamped above",
        "arcpy/devices/reference_ops.py",
        "    g = np.minimum(gate, F32(limit))\n",
        "    g = gate\n",
        ("tests/test_gpt_oss.py::test_with_a_float32_cache_the_reference_computes_what_transformers_computes",
         "tests/test_gpt_oss.py::test_the_clamped_glu"),
    ),
    Mutation(
        "MXFP4's first value of a byte is read from its high nibble",
        "arcpy/model/mxfp4.py",
        "    out[..., 0::2] = E2M1[blocks & 0x0F]\n",
        "    out[..., 0::2] = E2M1[blocks >> 4]\n",
        ("tests/test_gpt_oss.py::test_the_decoder_gives_back_what_the_encoder_packs",),  # runs without transformers
    ),
    Mutation(
        "the host path leaves the logit bias out",
        "arcpy/loop/host.py",
        "        bias = seq.bias_on_device  # the device adds the logit bias before the logits are read\n",
        "        bias = False\n",
        ("tests/test_logit_bias.py::test_a_bias_changes_the_tokens_alike_on_both_paths[sampling0]",),
    ),
    Mutation(
        "the answer splitter lets out what may still be the start of a tag",
        "arcpy/text/answer.py",
        "        keep = 0 if final or opener is None else _partial(self.buf, (opener,))\n",
        "        keep = 0\n",
        ("tests/test_answer.py::test_text_streams_on_while_no_tag_can_begin",),
    ),
    Mutation(
        "a constrained step draws from every id, not the ones the grammar allows",
        "arcpy/loop/constrain.py",
        "        self.ids = np.flatnonzero(allowed(self.mask, self.vocab))\n",
        "        self.ids = np.arange(self.vocab)\n",
        ("tests/test_constrained.py::test_a_gbnf_grammar_and_any_json_object",
         "tests/test_constrained.py::test_a_nan_is_not_hidden_by_the_mask"),
    ),
    Mutation(
        "a call's arguments reach the template as JSON text, not an object",
        "arcpy/text/tools.py",
        "            args = json.loads(args)\n",
        "            args = args\n",
        ("tests/test_agents_templates.py::test_tools_and_calls_render_as_transformers_renders_them"
         "[meta-llama-Llama-3.2-3B-Instruct]",),
    ),
    Mutation(
        "an answer of tool calls finishes with stop",
        "arcpy/serve/shape.py",
        '    return "tool_calls" if calls and reason == "stop" else reason\n',
        "    return reason\n",
        ("tests/test_agents_serve.py::test_the_openai_tool_flow_end_to_end",),
    ),
    Mutation(
        "the chat page's stop button does not abort the stream",
        "arcpy/serve/page.html",
        '$("stop").addEventListener("click", () => { if (running) running.abort(); });\n',
        '$("stop").addEventListener("click", () => {});\n',
        ("tests/test_serve_page.py::test_an_answer_streams_into_the_page_and_stop_cuts_it",),
    ),
    Mutation(
        "a stored response forgets its answer",
        "arcpy/serve/events.py",
        "            self.store.put(self.id, self.turn.conversation + [self._message()])\n",
        "            self.store.put(self.id, self.turn.conversation)\n",
        ("tests/test_serve_responses.py::test_the_tool_flow_by_previous_response_id_and_by_items",
         "tests/test_serve_responses.py::test_a_message_continues_by_previous_response_id"),
    ),
    Mutation(
        "router ties go to the higher expert",
        "arcpy/model/moe.py",
        '    return np.argsort(-values, axis=-1, kind="stable")[..., :k]\n',
        '    return (values.shape[-1] - 1 - np.argsort(-values[..., ::-1], axis=-1, kind="stable"))[..., :k]\n',
        ("tests/test_moe.py::test_ties_go_to_the_lower_expert",
         "tests/test_moe.py::test_forced_routing_with_tied_router_logits_picks_the_lowest_experts_in_the_model"),
    ),
    Mutation(
        "the shared expert ungated",
        "arcpy/devices/reference_ops.py",
        "            out = out + self.shared_w * linear(self.shared_h, L.s_down)\n",
        "            out = out + linear(self.shared_h, L.s_down)\n",
        ("tests/test_moe.py::test_the_reference_moe_op_matches_an_independent_computation[1-qwen2moe-shared]",),
    ),
    Mutation(
        "a model of the hub: a quantization matches a longer one (Q4_K picks Q4_K_M)",
        "arcpy/model/hub.py",
        '    return re.compile(rf"(?:^|[-./]){re.escape(quant.upper())}(?:$|[-./])")\n',
        '    return re.compile(rf"(?:^|[-./]){re.escape(quant.upper())}")\n',
        ("tests/test_hub.py::test_a_quantization_is_picked_as_a_whole_word_of_the_file_name",),
    ),
    Mutation(
        "a model of the hub: the cached revision is not the one asked for",
        "arcpy/model/hub.py",
        '        commit = self.revision or "main"\n',
        '        commit = "main"\n',
        ("tests/test_hub.py::test_names_resolve_from_the_cache_alone",),
    ),
    Mutation(
        "q8_0's halves rounded to even, not away from zero as the gguf package rounds them",
        "arcpy/devices/kv_formats.py",
        "    q = np.copysign(np.minimum(whole + np.floor(2 * (scaled - whole)), 127), blocks)  # halves away from zero\n",
        "    q = np.copysign(np.minimum(np.rint(scaled), 127), blocks)\n",
        ("tests/test_kv_formats.py::test_q8_0_reads_back_what_the_gguf_package_dequantizes[0]",),
    ),
    Mutation(
        "the chunked delta rule leaves the state's decay out of the deltas",
        "arcpy/devices/deltanet.py",
        "        rhs = bc[:, :, None] * (vc - np.exp(G)[:, :, None] * (kc @ s))\n",
        "        rhs = bc[:, :, None] * (vc - (kc @ s))\n",
        ("tests/test_deltanet_chunked.py::test_chunks_compute_what_the_rows_one_after_another_compute[150-64]",),
    ),
]


def copy_tree(dst: Path) -> None:
    # The built libarc.so and its headers come along: the model's tensor table and layer program
    # are libarc's, so the copy's arcpy needs its library even where no test runs on a GPU.
    for name in ("arcpy", "tests"):
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dst / "pyproject.toml")


def run_tests(where: Path, tests: tuple[str, ...]) -> tuple[set[str], str]:
    """Run the tests in `where` (its arcpy first on the path); return the failed ones."""
    env = dict(os.environ, PYTHONPATH=str(where), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *tests],
        cwd=where, env=env, capture_output=True, text=True, timeout=600)
    failed = set(re.findall(r"^FAILED (\S+?)(?: - |$)", proc.stdout, flags=re.M))
    return failed, proc.stdout + proc.stderr


def main() -> int:
    survived = 0
    with tempfile.TemporaryDirectory(prefix="arc-mutation-") as tmp:
        base = Path(tmp) / "base"
        copy_tree(base)
        probe = subprocess.run([sys.executable, "-c", "import arcpy; print(arcpy.__file__)"],
                               cwd=base, env=dict(os.environ, PYTHONPATH=str(base)),
                               capture_output=True, text=True)
        if not probe.stdout.startswith(str(base)):
            print(f"mutation check: the copy is not the arcpy that imports ({probe.stdout.strip()})")
            return 2
        all_tests = tuple(sorted({t for m in MUTATIONS for t in m.tests}))
        failed, log = run_tests(base, all_tests)
        if failed or "passed" not in log:
            print(f"mutation check: the unmutated tests do not pass:\n{log}")
            return 2
        for m in MUTATIONS:
            work = Path(tmp) / re.sub(r"\W+", "-", m.name)
            copy_tree(work)
            target = work / m.path
            text = target.read_text()
            if text.count(m.old) != 1:
                print(f"ERROR   {m.name}: its text is not found exactly once in {m.path}")
                survived += 1
                continue
            target.write_text(text.replace(m.old, m.new))
            failed, log = run_tests(work, m.tests)
            alive = [t for t in m.tests if t not in failed]
            if alive:
                survived += 1
                print(f"SURVIVED {m.name}: still passing: {', '.join(alive)}")
            else:
                print(f"killed   {m.name}: {len(m.tests)} named test(s) failed")
    print(f"mutation check: {len(MUTATIONS) - survived} of {len(MUTATIONS)} mutations killed")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())

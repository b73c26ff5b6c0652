"""The corpus generators (make_corpus, make_heldout, leave_voice_out, telephone_copy, prepare_fillets, word_times),
run from the repository root as ``python -m scripts.corpus.NAME ...``; they import each other as scripts.corpus.X."""

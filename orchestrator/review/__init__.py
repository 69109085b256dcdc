"""One review, as the data moves: freshness and the selector decide which (note, gate)
pairs are stale, jobs pack them and render prompts, bundle parses an agent's output,
finalize accepts it all-or-nothing, acceptance and export read the accepted reviews."""

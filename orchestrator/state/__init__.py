"""What reviewq remembers: state.db (the store and its migrations), the workspace that opens
a project's settings, KB and store together, status queries, and the files that render
state (job folders) after the transaction that decides them commits."""

"""`thornctl`, THORN's command line (Typer): a client of the REST API, never of the database.

`thornctl.main` holds the commands and documents the exit codes; `client` the HTTP side,
`files` reading documents and writing exports, `render` tables, JSON and YAML output.
"""

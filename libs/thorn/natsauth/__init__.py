"""THORN's NATS identities: decentralised JWT auth (operator mode). `jwt` signs and reads NATS
JWTs and creds files, `permissions` says what each role may do, `issue` makes the accounts,
users and the servers' configuration; all pure."""

"""Identity and secrets: keys, cloud credentials and identity, the cluster PKI."""

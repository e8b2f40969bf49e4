"""What the controller is configured with (its flags and environment, never desired/).

Where the API key may be sent (endpoint) and where results go (object_store)."""

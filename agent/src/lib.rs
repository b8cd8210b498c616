//! hako-agent: the reference in-container agent.

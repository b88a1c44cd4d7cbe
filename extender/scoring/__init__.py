"""Scoring: pure rules (`rules`), scores per key combined by specificity
(`keyscores`), the strategies that feed them from the history reader
(`strategies`), the webhook's weights and burst memory (`steering`), and the
cluster simulator that runs them over a synthetic workload (`simulation`, with its
`scenarios`, the webhook's `admissions` and kube-scheduler's `default_profile`)."""

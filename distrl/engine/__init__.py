"""The process engine: storages, actors, learners, evaluator and the trainer that runs them."""

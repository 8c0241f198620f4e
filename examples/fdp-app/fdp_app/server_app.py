"""ServerApp: FDPStrategy in place of FedAvg; noise, accounting and the ledger are fedfdp's."""

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from fdp_app.task import Net, evaluate
from fedfdp import Config, PrivacyConfig, RunConfig, TrainingConfig, build_plan
from strategies import FDPStrategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    cfg = Config(
        privacy=PrivacyConfig(
            mode="fdp",
            target_epsilon=float(rc["target-epsilon"]),
            sampling_rate=float(rc["sampling-rate"]),
            public_batch_size=int(rc["public-batch-size"]),
            num_rounds=int(rc["num-server-rounds"]),
        ),
        training=TrainingConfig(learning_rate=float(rc["learning-rate"]), seed=int(rc["seed"])),
        run=RunConfig(out_dir=str(rc["out-dir"]), progress=False),
    )
    model = Net()
    strategy = FDPStrategy(build_plan(cfg, model=model, num_devices=int(rc["num-devices"])))

    def central_evaluation(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord(evaluate(model))

    result = strategy.start(
        grid, ArrayRecord(model.state_dict()), num_rounds=cfg.privacy.num_rounds,
        evaluate_fn=central_evaluation,
    )
    last = max(result.evaluate_metrics_serverapp)
    eps = result.train_metrics_clientapp[last]["epsilon"]
    print(f"round {last}: {dict(result.evaluate_metrics_serverapp[last])}, "
          f"epsilon = {eps:.3f} (add/remove, upper bound, delta = {strategy.mechanism.delta:.2g})")

"""A Flax MLP of block-scaled Dense layers with sharded parameters: data x model parallel on a 2-D mesh.

    python examples/sharded_mlp.py                      # 8 simulated CPU devices, or the GPUs present
    python examples/sharded_mlp.py --recipe fp8_deepseek --d-ff 1024

Parameters carry logical axis names (`nn.with_logical_partitioning`): the first layer's kernel is
("embed", "mlp"), the second's ("mlp", "embed"); the rules map "batch" -> "data" and "mlp" -> "model". The
first layer is then column parallel (its weight split on N), the second row parallel (its weight split on
K, partial products all-reduced): Megatron's MLP, with block-scaled GEMMs that XLA partitions through
`jax_blockscale.partitioning` instead of gathering the weights. The script prints the parameter shardings,
the collectives in the compiled forward and training step, and the difference from an unsharded run; then
it quantizes the kernels for serving (`quantize_params`, stored (N, K): each quantized leaf is named after
its own layout, so the same rules keep the first layer column parallel) and runs the served forward.
"""

from __future__ import annotations

import os

# Simulated devices for a CPU-only machine; this flag only affects the CPU platform, GPUs are used if present.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    _flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()

import argparse  # noqa: E402
import re  # noqa: E402
from collections import Counter  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jax_blockscale.nn.linen import Dense, quantize_params  # noqa: E402

RULES = (("batch", "data"), ("mlp", "model"), ("embed", None))


class MLP(nn.Module):
    """x (batch, embed) -> Dense(d_ff) -> gelu -> Dense(d_model), every GEMM block-scaled by `recipe`."""

    d_model: int
    d_ff: int
    recipe: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        init = nn.initializers.lecun_normal()
        h = Dense(self.d_ff, recipe=self.recipe,
                  kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)))(x)
        # The hidden activation stays split on "mlp": the second GEMM contracts it where it lies.
        h = nn.with_logical_constraint(nn.gelu(h), ("batch", "mlp"))
        y = Dense(self.d_model, recipe=self.recipe,
                  kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)))(h)
        return nn.with_logical_constraint(y, ("batch", "embed"))


def collectives(compiled) -> dict[str, int]:
    """Collective ops in a compiled executable's HLO with their result shapes, e.g. 'all-reduce f32[32,256]'
    (async "-start" ops counted once; XLA may combine several reductions into one tuple-shaped op)."""
    ops = re.findall(r"= (\([^=]*?\)|\S+) (all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                     r"(?:-start)?\(", compiled.as_text())
    return dict(Counter(f"{op} {re.sub(r'[{][^}]*[}]', '', shape)}" for shape, op in ops))


def make_mesh(model: int) -> jax.sharding.Mesh:
    n = jax.device_count()
    model = min(model, n)
    return jax.make_mesh((n // model, model), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="mxfp8", help="mxfp8, nvfp4, fp8_deepseek, mxfp8_e5m2_grads")
    parser.add_argument("--batch", type=int, default=256,
                        help="tokens; fp8_deepseek's wgrad quantizes along them, 128 per block per device")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=512,
                        help="fp8_deepseek: a multiple of 128 x the model axis")
    parser.add_argument("--model-parallel", type=int, default=4, help="size of the mesh's 'model' axis")
    args = parser.parse_args(argv)

    mesh = make_mesh(args.model_parallel)
    print(f"{jax.device_count()} {jax.devices()[0].platform} devices, mesh {dict(mesh.shape)}, "
          f"recipe {args.recipe}")
    model = MLP(args.d_model, args.d_ff, args.recipe)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((args.batch, args.d_model)), jnp.float32)
    target = jnp.asarray(rng.standard_normal((args.batch, args.d_model)), jnp.float32)

    # Shardings from the logical names: the standard Flax recipe (abstract init -> specs -> mesh shardings).
    abstract = jax.eval_shape(model.init, jax.random.key(0), x)
    param_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(abstract), mesh, RULES)
    data = NamedSharding(mesh, P("data", None))
    with nn.logical_axis_rules(RULES):
        variables = jax.jit(model.init, out_shardings=param_shardings)(jax.random.key(0), x)
    for path, leaf in jax.tree_util.tree_leaves_with_path(variables):
        value = leaf.unbox() if isinstance(leaf, nn.Partitioned) else leaf
        print(f"  {jax.tree_util.keystr(path):<48} {str(value.shape):<12} {value.sharding.spec}")

    def loss_fn(variables, x, target):
        return jnp.mean((model.apply(variables, x) - target) ** 2)

    def train_step(variables, x, target):
        loss, grads = jax.value_and_grad(loss_fn)(variables, x, target)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, variables, grads), loss

    with nn.logical_axis_rules(RULES):
        forward = jax.jit(model.apply, in_shardings=(param_shardings, data), out_shardings=data)
        step = jax.jit(train_step, in_shardings=(param_shardings, data, data),
                       out_shardings=(param_shardings, None))
        xs, ts = jax.device_put(x, data), jax.device_put(target, data)
        fwd_colls = collectives(forward.lower(variables, xs).compile())
        step_colls = collectives(step.lower(variables, xs, ts).compile())
        y = forward(variables, xs)
        new_vars, loss = step(variables, xs, ts)

    # The same computation on one device, from the same parameters.
    local = jax.device_put(jax.tree_util.tree_map(np.asarray, variables), jax.devices()[0])
    y_ref = jax.jit(model.apply)(local, x)
    vars_ref, loss_ref = jax.jit(train_step)(local, x, target)
    y, y_ref = np.asarray(y), np.asarray(y_ref)
    rel = float(np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref))
    upd = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
              zip(jax.tree_util.tree_leaves(new_vars), jax.tree_util.tree_leaves(vars_ref)))
    print(f"forward collectives: {fwd_colls or 'none'}   (row-parallel second layer: one all-reduce)")
    print(f"train-step collectives: {step_colls or 'none'}")
    print(f"sharded vs one device: forward rel diff {rel:.1e}, loss {float(loss):.6f} vs {float(loss_ref):.6f}, "
          f"max parameter-update diff {upd:.1e}")

    # Serving: quantize once, place with the shardings the same logical rules give the quantized tree.
    served = quantize_params(model, variables, x)
    served_shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(served), mesh, RULES)
    served = jax.device_put(served, served_shardings)
    with nn.logical_axis_rules(RULES):
        serve = jax.jit(model.apply, in_shardings=(served_shardings, data), out_shardings=data)
        serve_colls = collectives(serve.lower(served, xs).compile())
        y_served = np.asarray(serve(served, xs))
    kernel = nn.unbox(served)["params"]["Dense_0"]["kernel"]
    print(f"served first-layer kernel {kernel.values.shape} (N, K): values {kernel.values.sharding.spec}, "
          f"scales {kernel.scales.sharding.spec}")
    print(f"served forward collectives: {serve_colls or 'none'}, rel diff from the training forward "
          f"{float(np.linalg.norm(y_served - y) / np.linalg.norm(y)):.1e}")
    if any("all-gather" in op for op in (*fwd_colls, *serve_colls)):
        print("WARNING: the forward gathers an operand")
    return {"forward": fwd_colls, "step": step_colls, "serve": serve_colls, "rel": rel}


if __name__ == "__main__":
    main()

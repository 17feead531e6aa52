// CartPole-v1 in C++: gymnasium's classic_control/cartpole.py, operation for operation,
// with the 500-step time limit gymnasium.make adds. The learner publishes the env's spaces
// and the actor must step the same dynamics, so every constant and formula below is
// gymnasium's (the state stays float64; observations are its float32 rounding).
#pragma once

#include <array>
#include <cmath>
#include <random>

namespace seedrl {

class CartPole {
 public:
  static constexpr double kGravity = 9.8;
  static constexpr double kMassCart = 1.0;
  static constexpr double kMassPole = 0.1;
  static constexpr double kTotalMass = kMassPole + kMassCart;
  static constexpr double kLength = 0.5;  // half the pole's length
  static constexpr double kPoleMassLength = kMassPole * kLength;
  static constexpr double kForceMag = 10.0;
  static constexpr double kTau = 0.02;  // seconds between state updates
  static constexpr double kThetaThreshold = 12 * 2 * M_PI / 360;
  static constexpr double kXThreshold = 2.4;
  static constexpr int kMaxEpisodeSteps = 500;
  static constexpr int kObsDim = 4;
  static constexpr int kNumActions = 2;

  struct Outcome {
    float reward;
    bool terminated;
    bool truncated;
  };

  // A new episode: every state variable uniform in [-0.05, 0.05), as gymnasium's reset.
  void Reset(std::mt19937_64& rng) {
    std::uniform_real_distribution<double> start(-0.05, 0.05);
    for (double& v : state_) v = start(rng);
    steps_ = 0;
  }

  // One step of the euler integrator with a push left (0) or right (1).
  Outcome Step(int action) {
    auto [x, x_dot, theta, theta_dot] = state_;
    const double force = action == 1 ? kForceMag : -kForceMag;
    const double costheta = std::cos(theta);
    const double sintheta = std::sin(theta);
    const double temp = (force + kPoleMassLength * (theta_dot * theta_dot) * sintheta) / kTotalMass;
    const double thetaacc = (kGravity * sintheta - costheta * temp) /
                            (kLength * (4.0 / 3.0 - kMassPole * (costheta * costheta) / kTotalMass));
    const double xacc = temp - kPoleMassLength * thetaacc * costheta / kTotalMass;
    x = x + kTau * x_dot;
    x_dot = x_dot + kTau * xacc;
    theta = theta + kTau * theta_dot;
    theta_dot = theta_dot + kTau * thetaacc;
    state_ = {x, x_dot, theta, theta_dot};
    ++steps_;
    const bool terminated = x < -kXThreshold || x > kXThreshold || theta < -kThetaThreshold ||
                            theta > kThetaThreshold;
    return {1.0f, terminated, steps_ >= kMaxEpisodeSteps};
  }

  void Observe(float* out) const {
    for (int i = 0; i < kObsDim; ++i) out[i] = static_cast<float>(state_[i]);
  }

 private:
  std::array<double, 4> state_{};
  int steps_ = 0;
};

}  // namespace seedrl
